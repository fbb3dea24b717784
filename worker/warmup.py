"""Pay a worker process's one-time start-up costs before its first job, not inside it.

Why: the first optimizer a process builds imports torch's compiler stack (about a second on the
development VM), and the first CUDA call creates the device context (about a second on a GPU), and the first report's
single-job ε starts the accountants' fork server (about a second).
Inside a job those seconds count against its time limit and its examples/s; at worker start they
cost nothing a user waits for.
"""

from __future__ import annotations

import logging
import time

import torch

from kernel.privacy.single_job import start_accountant_server

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


def warm_up() -> float:
    """Build a throwaway optimizer, start the accountants' fork server and, on a GPU machine, create
    the CUDA context; seconds it took."""
    started = time.perf_counter()
    start_accountant_server()  # the report's single-job ε runs in its children
    parameter = torch.zeros(1, requires_grad=True)
    torch.optim.SGD([parameter], lr=0.0)  # imports torch._dynamo, as every optimizer's first build does
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # creates the device context
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    log.info("worker warmed up", extra={"seconds": round(seconds, 3), "cuda": torch.cuda.is_available()})
    return seconds
