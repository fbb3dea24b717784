"""A dependency-free progress bar for job steps and ε spent, written to stderr.

On a terminal it redraws one line; elsewhere (logs, CI, CliRunner) it writes a line only when the
status changes or another tenth of the steps is done, so captured output stays short.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from privtrain.resources import Job
from privtrain_common.directed_rounding import format_guarantee


@dataclass(frozen=True)
class JobProgress:
    """One snapshot of a job as a progress source sees it (public values only)."""

    job: Job
    epsilon_spent: float | None

    @property
    def steps_done(self) -> int:
        return self.job.steps_run or 0

    @property
    def steps_planned(self) -> int:
        return self.job.steps_planned or 0


def render(progress: JobProgress, *, width: int = 30) -> str:
    planned = max(progress.steps_planned, 1)
    done = min(progress.steps_done, planned)
    filled = round(width * done / planned)
    bar = "#" * filled + "-" * (width - filled)
    eps = format_guarantee(progress.epsilon_spent)
    budget = format_guarantee(progress.job.epsilon_reserved) if progress.job.epsilon_reserved is not None else "?"
    return (
        f"{progress.job.id} [{bar}] {progress.steps_done}/{progress.steps_planned} steps"
        f"  ε spent {eps} of {budget}  {progress.job.status}"
    )


class ProgressBar:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self._last = ""
        self._milestone: tuple[str, int] | None = None
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def update(self, progress: JobProgress) -> None:
        text = render(progress)
        if text == self._last:
            return
        if self._tty:
            pad = " " * max(0, len(self._last) - len(text))
            self.stream.write("\r" + text + pad)
        else:
            milestone = (progress.job.status, 10 * progress.steps_done // max(progress.steps_planned, 1))
            if milestone == self._milestone:
                return
            self._milestone = milestone
            self.stream.write(text + "\n")
        self.stream.flush()
        self._last = text

    def close(self) -> None:
        if self._tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
