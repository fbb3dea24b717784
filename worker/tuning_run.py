"""A tuning's trials on several workers at once, through its trial queue (app/tuning/trial_queue.py).

The job's own worker (the owner) enqueues the K trials it drew, asks other workers to help, takes
trials itself until none is pending, waits for the helpers' trials (putting back those whose
worker vanished), and selects the best. A helper takes trials until none is pending; it keeps a
trained model (as a private file, app/tuning/trial_files.py) only while no finished trial
beats it, so at most a few models wait at any time. Which trial wins is a total order on (metric,
order of drawing), so the owner's choice does not depend on which worker ran what, or when.

Nothing here says how many trials ran: no event, log line or progress is written per trial.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from app.db import Database
from app.models import utcnow
from app.tuning import trial_queue
from app.tuning.trial_files import TrialFiles
from app.tuning.trial_queue import TakenTrial
from worker.tuning import TrialResult, best_of, better, score_of

__all__ = ["OwnedResult", "Pacer", "TrialWork", "help_with_trials", "run_owned_trials"]

TrainOne = Callable[[int, Callable[[], bool]], tuple[dict[str, Any], nn.Module] | None]
"""Train candidate ``index`` until done (its released metrics and model) or until ``stop()``
says so (None)."""


@dataclass
class Pacer:
    """A stop probe for the training loop: runs ``check`` (a heartbeat that answers "stop?") at
    most every ``interval_s`` and remembers a stop; past ``deadline`` (time.monotonic()) it stops."""

    interval_s: float
    check: Callable[[], bool]
    deadline: float = float("inf")
    stopped: bool = False
    _last: float = field(default=-float("inf"), repr=False)

    @property
    def timed_out(self) -> bool:
        return time.monotonic() > self.deadline

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.stopped and now - self._last >= self.interval_s:
            self._last = now
            self.stopped = self.check()
        return self.stopped or now > self.deadline


@dataclass(frozen=True)
class TrialWork:
    """One worker's share of one attempt of a tuning."""

    db: Database
    job_id: str
    attempt: int
    worker: str
    metric: str
    interval_s: float
    train: TrainOne

    def take(self) -> TakenTrial | None:
        return trial_queue.take(self.db, job_id=self.job_id, attempt=self.attempt, worker=self.worker)

    def run(self, taken: TakenTrial, stop: Callable[[], bool]) -> tuple[TrialResult, nn.Module] | None:
        """Train the taken trial, beating for it; None when it was stopped."""
        beat = Pacer(self.interval_s, check=lambda: trial_queue.heartbeat(self.db, trial=taken))
        ran = self.train(taken.candidate, lambda: stop() or beat())
        if ran is None:
            return None
        metrics, model = ran
        result = TrialResult(
            seq=taken.seq, candidate=taken.candidate, metrics=metrics, score=score_of(metrics, self.metric)
        )
        return result, model

    def finished(self) -> list[tuple[TrialResult, str | None]]:
        """The attempt's finished trials, each with its kept model file (None: the owner's own or
        not kept)."""
        return [
            (TrialResult(seq=t.seq, candidate=t.candidate, metrics=t.metrics, score=t.score), t.model_file)
            for t in trial_queue.finished(self.db, job_id=self.job_id, attempt=self.attempt)
        ]


@dataclass(frozen=True)
class OwnedResult:
    best: TrialResult
    model: nn.Module | None
    """The owner's own model when it ran the best trial; else ``model_file`` names a helper's."""
    model_file: str | None


def run_owned_trials(
    work: TrialWork, *, job_stop: Pacer, stale_after_s: float, max_takes: int, poll_s: float
) -> OwnedResult | None:
    """The owner's loop (the trials are enqueued); None when the job was stopped (cancelled, out of
    time, or no longer this attempt's). Raises trial_queue.TrialsLost when a helper's trial was
    lost on every take."""
    own: tuple[TrialResult, nn.Module] | None = None
    while not job_stop():
        taken = work.take()
        if taken is not None:
            ran = work.run(taken, job_stop)
            if ran is None:
                continue  # stopped (the loop ends) or given to another worker (it runs again)
            result, model = ran
            recorded = trial_queue.finish(
                work.db, trial=taken, score=result.score, metrics=result.metrics, model_file=None
            )
            if recorded and better(result, own[0] if own is not None else None, work.metric):
                own = (result, model)
            continue
        waiting = trial_queue.counts(work.db, job_id=work.job_id, attempt=work.attempt)
        if waiting.pending == 0 and waiting.running == 0:
            return _selected(work, own)
        trial_queue.requeue_stale(
            work.db,
            job_id=work.job_id,
            attempt=work.attempt,
            stale_before=utcnow() - dt.timedelta(seconds=stale_after_s),
            max_takes=max_takes,
        )
        time.sleep(poll_s)
    return None


def _selected(work: TrialWork, own: tuple[TrialResult, nn.Module] | None) -> OwnedResult:
    finished = work.finished()
    best = best_of((result for result, _ in finished), work.metric)
    if best is None:
        raise RuntimeError("a tuning's trials all ended without a result")
    if own is not None and own[0].seq == best.seq:
        return OwnedResult(best=best, model=own[1], model_file=None)
    model_file = dict((result.seq, name) for result, name in finished)[best.seq]
    if model_file is None:
        raise RuntimeError("the best trial's model was not kept")
    return OwnedResult(best=best, model=None, model_file=model_file)


def help_with_trials(
    work: TrialWork, *, files: TrialFiles, write_model: Callable[[int, nn.Module], Path], deadline: float
) -> None:
    """A helper's loop: take and run pending trials until none is left or time is up."""
    while time.monotonic() < deadline:
        taken = work.take()
        if taken is None:
            return
        ran = work.run(taken, lambda: time.monotonic() > deadline)
        if ran is None:
            continue  # the attempt ended (nothing is pending then) or the trial was given away
        result, model = ran
        name = None
        may_win = best_of([*(done for done, _ in work.finished()), result], work.metric) is result
        if may_win:  # else a finished trial already beats it: its model is never needed
            name = files.name(taken)
            files.keep(name, write_model(taken.candidate, model))
        if not trial_queue.finish(work.db, trial=taken, score=result.score, metrics=result.metrics, model_file=name):
            files.discard([name] if name is not None else [])
