"""``serve``'s side of tying its worker's life to its own: a worker that outlives ``serve``
would keep taking jobs with no API in front of it (and, on restart, run beside a fresh one).

``privtrain-admin serve`` starts one worker as its child. If ``serve`` is killed outright
(SIGKILL, the OOM killer) it cannot stop the worker, so two layers do:

* Linux: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` between fork and exec (:func:`die_with_parent`),
  so the kernel signals the worker the moment its parent dies.
* Anywhere: ``serve`` names itself in :data:`PARENT_PID_ENV`, and the worker polls its parent
  pid against it (``worker.parent_watch``); a reparented process sees another ppid. This also
  covers the window before prctl ran.

Both end in SIGTERM, the worker's ordinary stop (what ``serve`` itself sends on a clean exit):
Celery finishes the job it is running, takes no new one and exits; a job it cannot finish is
settled by the reconciler like any lost worker's. Here, in the kernel, because ``serve`` runs in
the API process, which never imports ``worker/``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Final

__all__ = ["PARENT_PID_ENV", "die_with_parent"]

PARENT_PID_ENV: Final[str] = "PRIVTRAIN_PARENT_PID"
"""Set by ``serve`` in its worker's environment: the pid the worker must outlive no longer than."""
_PR_SET_PDEATHSIG: Final[int] = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (no dlopen between fork and exec), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
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
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
