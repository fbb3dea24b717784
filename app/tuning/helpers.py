"""Asking other workers to run a tuning's trials (app/tuning/trial_queue.py says how they share them)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["TrialHelpers"]


class TrialHelpers(Protocol):
    """What sends a helper's message (app.services.CeleryDispatcher; a recorder in tests)."""

    def ask_for_trial_helper(self, job_id: str, *, attempt: int, index: int, queue: str | None) -> None: ...
