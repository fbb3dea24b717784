"""The worker's side of stopping with ``serve``: poll the parent pid that ``serve`` named.

``serve`` puts its pid in :data:`kernel.parent_death.PARENT_PID_ENV` (and, on Linux, asks the kernel
to SIGTERM the worker when it dies: ``kernel.parent_death.die_with_parent``). Here the worker checks
``os.getppid()`` against that pid every second; a reparented process sees another ppid, so the
worker stops even where prctl is unavailable or had not run yet. SIGTERM is the worker's
ordinary stop: Celery finishes the job it is running, takes no new one and exits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Final

from kernel.parent_death import PARENT_PID_ENV

__all__ = ["PARENT_PID_ENV", "start_from_environment", "watch_parent"]

POLL_INTERVAL_S: Final[float] = 1.0

log = logging.getLogger(__name__)


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def watch_parent(
    parent_pid: int, *, interval_s: float = POLL_INTERVAL_S, on_orphaned: Callable[[], None] = _stop_self
) -> threading.Thread:
    """A daemon thread that calls ``on_orphaned`` once this process's parent is no longer ``parent_pid``."""

    def run() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        log.warning("parent process is gone; stopping", extra={"parent_pid": parent_pid})
        on_orphaned()

    thread = threading.Thread(target=run, name="parent-watch", daemon=True)
    thread.start()
    return thread


def start_from_environment(*, interval_s: float = POLL_INTERVAL_S) -> threading.Thread | None:
    """Watch the parent named in PARENT_PID_ENV; None when unset (a worker run on its own)."""
    value = os.environ.get(PARENT_PID_ENV, "").strip()
    if not value.isdigit():
        return None
    return watch_parent(int(value), interval_s=interval_s)
