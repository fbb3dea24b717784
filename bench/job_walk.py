"""The worker → kernel walk of one job: every call from a function in worker/ to one in kernel/.

Why: a thin worker asks the kernel for few things, each in one place. This runs one tiny tabular
job in process (logistic regression on scikit-learn's digits, DP-SGD, 20 steps, a DP-evaluated
hold-out, checkpoints on) with ``JobRunner(...).run(job_id)`` under ``sys.setprofile``, and records
each call whose caller's code lies under worker/ and whose callee's under kernel/. Prints every
distinct call site (caller file:line → callee), the number of distinct sites and of calls. The
runner is built before the walk starts (a worker process builds it once).

    .venv/bin/python -m bench.job_walk

Measured on the 2-core development VM, 2026-11-28 (see docs/benchmarks.md):

- before the split (worker/runner.py, one 1,152-line class): 51 distinct call sites
  (site → callee) on 45 caller lines, 61 to 64 calls (checkpoint and progress writes follow the clock).
- after (JobRunner a facade over worker/ modules, kernel/job_run.py the kernel's side):
  10 distinct call sites on 10 lines, 15 calls: preparing and claiming the job, its data, its
  private state, keeping a private file (hold-out split and checkpoints, one place), the chunk
  size, progress, the evaluation's noise scale and released metric, and the release (the model
  stored, the report prepared, the commit, the report uploaded).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from bench.in_process import in_process_service
from kernel.config import Settings

REPO = Path(__file__).resolve().parents[1]
WORKER = str(REPO / "worker") + "/"
KERNEL = str(REPO / "kernel") + "/"


def tiny_job(dataset_id: str) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 20.0},
        "training": {"steps": 20, "batch_size": 16, "learning_rate": 0.1},
        "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5},
    }


class Walk:
    """The calls from worker/ into kernel/ seen by a profile function, by call site."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call":
            return
        caller = frame.f_back
        if caller is None or not caller.f_code.co_filename.startswith(WORKER):
            return
        callee = frame.f_code
        if not callee.co_filename.startswith(KERNEL):
            return
        site = f"{caller.f_code.co_filename.removeprefix(str(REPO) + '/')}:{caller.f_lineno}"
        module = callee.co_filename.removeprefix(str(REPO) + "/").removesuffix(".py").replace("/", ".")
        self.calls[(site, f"{module}.{callee.co_qualname}")] += 1


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    # The runner loads torch: only the walk needs it, and the service above it does not.
    from worker.runner import JobRunner

    with tempfile.TemporaryDirectory() as directory:
        settings = Settings(  # type: ignore[call-arg]
            environment="test",
            data_dir=Path(directory),
            rate_limit_per_minute=0,
            heartbeat_interval_s=30.0,
            checkpoint_every_steps=5,
        )
        with in_process_service(settings) as (client, db, dataset_id):
            submitted = client.post("/v1/jobs", json=tiny_job(dataset_id))
            assert submitted.status_code == 202, submitted.text
            runner = JobRunner(settings, db=db)
            walk = Walk()
            threading.setprofile(walk)
            sys.setprofile(walk)
            try:
                status = runner.run(submitted.json()["id"])
            finally:
                sys.setprofile(None)
                threading.setprofile(None)  # type: ignore[arg-type]
            assert status == "succeeded", status
    for (site, callee), count in sorted(walk.calls.items()):
        print(f"{site:<34} → {callee}  ×{count}")
    lines = {site for site, _ in walk.calls}
    print(f"distinct call sites (site → callee): {len(walk.calls)}; caller lines: {len(lines)}; calls: {walk.total}")


if __name__ == "__main__":
    main()
