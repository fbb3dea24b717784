"""One slot of a tuning on a worker: run the next pending trial, if there is one, then wait out
the slot's fixed length (kernel/tuning/slots.py says why every slot lasts the same).

A slot's clock starts when the worker claims it. Its trial (data loading included) is stopped at
the trial time limit and then releases nothing (``lapsed``); evaluating it and storing its model
must fit in the slot's margin, after which the slot waits until ``slot_seconds`` have passed. A
slot that ends later than that has not kept its length and fails the tuning. Nothing here says
whether a slot held a trial: no event, no log line, the same duration.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Pacer", "SlotClock", "SlotTrial", "wait_out"]


@dataclass
class Pacer:
    """A stop probe: runs ``check`` (a heartbeat that answers "stop?") at most every
    ``interval_s`` and remembers a stop."""

    interval_s: float
    check: Callable[[], bool]
    stopped: bool = False
    _last: float = field(default=-float("inf"), repr=False)

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self.stopped and now - self._last >= self.interval_s:
            self._last = now
            self.stopped = self.check()
        return self.stopped


@dataclass(frozen=True)
class SlotClock:
    """A slot's public times, from the moment its worker claimed it (time.monotonic())."""

    started: float
    trial_time_limit_s: float
    slot_seconds: float

    @classmethod
    def start(cls, schedule: dict[str, Any]) -> SlotClock:
        return cls(
            started=time.monotonic(),
            trial_time_limit_s=float(schedule["trial_time_limit_s"]),
            slot_seconds=float(schedule["slot_seconds"]),
        )

    @property
    def trial_deadline(self) -> float:
        return self.started + self.trial_time_limit_s

    @property
    def end(self) -> float:
        return self.started + self.slot_seconds

    def trial_timed_out(self) -> bool:
        return time.monotonic() > self.trial_deadline

    def overran(self) -> bool:
        return time.monotonic() > self.end


class SlotTrial(enum.Enum):
    """What a slot did with the trial queue (never shown: it would count trials)."""

    NONE = "none"
    """No trial was pending."""
    FINISHED = "finished"
    LAPSED = "lapsed"
    """Still training at the trial time limit: it released nothing."""
    STOPPED = "stopped"
    """The tuning ended (a cancel) while it ran: nothing is recorded."""


def wait_out(clock: SlotClock, stop: Pacer) -> bool:
    """Wait until the slot's end, beating; False when the tuning ended meanwhile."""
    while True:
        if stop():
            return False
        left = clock.end - time.monotonic()
        if left <= 0.0:
            return True
        time.sleep(min(left, stop.interval_s))
