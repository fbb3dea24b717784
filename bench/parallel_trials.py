"""Wall time of one tuning's trials on one worker against several (parallel trials).

Why: a tuning's K trials are independent; with ``PRIVTRAIN_TUNING_PARALLEL_TRIALS`` = P the
tuning's worker shares them with up to P − 1 free workers through its trial queue
(docs/tuning.md#parallel-trials). This measures what that buys end to end: the tuning's job run
by a real ``JobRunner`` (claim, K trials, selection, model and report, commit) against embedded
SQLite, its helpers real ``JobRunner``s in their own processes, already started and waiting as
idle Celery workers would (a queue stands in for the broker). Every process uses one torch
thread, as one worker per core. K is fixed here so that the runs compare (the service draws it
secretly); each run is a fresh tuning of the same search space on scikit-learn's digits.

    .venv/bin/python -m bench.parallel_trials --trials 8 --workers 1 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from fastapi.testclient import TestClient

from app.config import Settings
from bench.in_process import in_process_service
from worker.runner import JobRunner

CONTEXT = mp.get_context("fork")  # children inherit the settings and the fixed K, never re-import


class _QueueHelpers:
    """The owner's way to wake a waiting helper process (the broker's role)."""

    def __init__(self, inbox: Queue[tuple[str, int] | None]) -> None:
        self.inbox = inbox

    def ask_for_trial_helper(self, job_id: str, *, attempt: int, index: int, queue: str | None) -> None:
        self.inbox.put((job_id, attempt))


def _helper(settings: Settings, inbox: Queue[tuple[str, int] | None]) -> None:
    torch.set_num_threads(1)
    runner = JobRunner(settings)
    while (message := inbox.get()) is not None:
        runner.help_with_trials(*message)


def _owner(settings: Settings, job_id: str, trials: int, inbox: Queue[Any], out: Queue[Any]) -> None:
    torch.set_num_threads(1)
    runner = JobRunner(settings, helpers=_QueueHelpers(inbox))
    with mock.patch("app.privacy.sample_trial_count", return_value=trials):
        start = time.perf_counter()
        status = runner.run(job_id)
        out.put((status, time.perf_counter() - start))


def _request(dataset_id: str, steps: int) -> dict[str, Any]:
    return {
        "base": {
            "dataset_id": dataset_id,
            "model": {"name": "mlp", "params": {"hidden_sizes": [256]}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"target_epsilon": 0.5},
            "training": {"steps": steps, "batch_size": 64, "learning_rate": 0.5},
            "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.1},
        },
        "search_space": {"training.learning_rate": [0.1, 0.5, 1.0], "algorithm.hyperparameters.clipping_norm": [1, 2]},
        "trials": {"mean": 3},
        "selection": {"metric": "accuracy"},
    }


def run(workers: int, *, settings: Settings, client: TestClient, dataset_id: str, trials: int, steps: int) -> float:
    """Seconds the tuning's job took with ``workers`` workers (its own and workers − 1 helpers)."""
    settings = settings.model_copy(update={"tuning_parallel_trials": workers})
    created = client.post("/v1/tuning-jobs", json=_request(dataset_id, steps))
    assert created.status_code == 202, created.text
    inbox: Queue[Any] = CONTEXT.Queue()
    out: Queue[Any] = CONTEXT.Queue()
    helpers = [CONTEXT.Process(target=_helper, args=(settings, inbox)) for _ in range(workers - 1)]
    for helper in helpers:
        helper.start()
    owner = CONTEXT.Process(target=_owner, args=(settings, created.json()["job_id"], trials, inbox, out))
    owner.start()
    status, seconds = out.get(timeout=3600)
    owner.join()
    for _ in helpers:
        inbox.put(None)
    for helper in helpers:
        helper.join()
    assert status == "succeeded", status
    return float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8, help="K, fixed for the comparison")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300, help="steps per trial")
    parser.add_argument("--repeats", type=int, default=2, help="runs per worker count (the median is shown)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        settings = Settings(environment="test", data_dir=Path(directory), rate_limit_per_minute=0)  # type: ignore[call-arg]
        with in_process_service(settings) as (client, _, dataset_id):
            seconds = {
                workers: float(
                    np.median(
                        [
                            run(
                                workers,
                                settings=settings,
                                client=client,
                                dataset_id=dataset_id,
                                trials=args.trials,
                                steps=args.steps,
                            )
                            for _ in range(args.repeats)
                        ]
                    )
                )
                for workers in args.workers
            }
    base = seconds[args.workers[0]]
    print(f"| workers | seconds (K = {args.trials}, {args.steps} steps per trial) | speed-up |")
    print("|---:|---:|---:|")
    for workers, value in seconds.items():
        print(f"| {workers} | {value:.1f} | {base / value:.2f}× |")


if __name__ == "__main__":
    main()
