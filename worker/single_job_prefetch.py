"""The report's single-job ε of a job's planned run, computed in the background while it trains.

Why: the numeric accountants run in a time- and memory-capped child process (kernel.privacy.single_job)
that takes from a fraction of a second to many seconds, spawn included. Computed after training, it
was most of a short GPU job's time beyond its steps. The planned event is public and fixed at
claim time, so its ε can be computed while the job trains; a job that ran differently (stopped
early) has its own event computed afterwards, as before.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kernel import privacy
from kernel.reporting.privacy_report import report_single_job_epsilon

__all__ = ["SingleJobPrefetch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SingleJobPrefetch:
    planned_event: dict[str, Any]
    future: Future[privacy.SingleJobEpsilon] = field(repr=False)

    @classmethod
    def start(cls, planned_event: dict[str, Any], *, delta: float, algorithm: str) -> SingleJobPrefetch:
        """Start computing on a daemon thread (it waits on the capped child process, so it holds
        no lock and no GIL meanwhile; a worker shutting down does not wait for it)."""
        future: Future[privacy.SingleJobEpsilon] = Future()

        def compute() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(report_single_job_epsilon(planned_event, delta=delta, algorithm=algorithm))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
                future.set_exception(exc)

        threading.Thread(target=compute, name="single-job-epsilon", daemon=True).start()
        return cls(planned_event=planned_event, future=future)

    def result_for(self, actual_event: dict[str, Any]) -> privacy.SingleJobEpsilon | None:
        """The prefetched ε when the job's actual event is the planned one, else None (the caller
        computes it). A failed prefetch is None too: the caller's own attempt reports its reason."""
        if actual_event != self.planned_event:
            return None
        try:
            return self.future.result()
        except Exception:
            log.exception("the prefetched single-job epsilon failed; computing it again")
            return None
