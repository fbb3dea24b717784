"""A child process that stops when the process that started it is gone.

``privtrain-admin serve`` runs the API and starts one worker as its child. If ``serve`` is killed
outright (SIGKILL, the OOM killer) it cannot stop the worker, and an orphaned worker would keep
taking jobs with no API in front of it (and, on restart, run beside a fresh one). Two layers:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` between fork and exec (:func:`die_with_parent`),
  so the kernel signals the worker the moment its parent dies.
* Anywhere: the worker polls ``os.getppid()`` against the parent pid it was given in
  :data:`PARENT_PID_ENV` (:func:`start_from_environment`); a reparented process sees another
  ppid. This also covers the window before prctl ran.

Both end in SIGTERM, the worker's ordinary stop (what ``serve`` itself sends on a clean exit):
Celery finishes the job it is running, takes no new one and exits; a job it cannot finish is
settled by the reconciler like any lost worker's. Torch-free, so the API process can import it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = ["PARENT_PID_ENV", "die_with_parent", "start_from_environment", "watch_parent"]

PARENT_PID_ENV: Final[str] = "PRIVTRAIN_PARENT_PID"
"""Set by ``serve`` in its worker's environment: the pid the worker must outlive no longer than."""
POLL_INTERVAL_S: Final[float] = 1.0
_PR_SET_PDEATHSIG: Final[int] = 1

log = logging.getLogger(__name__)


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (no dlopen between fork and exec), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for Popen that makes the child get SIGTERM when this process dies, or None
    where prctl is unavailable (the child's ppid watch still applies).

    The pid check after prctl closes the race where the parent died between fork and prctl. Call it
    from the thread that stays alive as long as the process: PDEATHSIG follows the forking thread.
    """
    prctl = _load_prctl()
    if prctl is None:
        return None
    parent_pid = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:
            _stop_self()

    return preexec


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
