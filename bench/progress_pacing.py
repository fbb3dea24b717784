"""A short job's training loop with progress paced (worker.train.PROGRESS_MIN_GAP_S) and with a
progress write after every step, alternating, in one process.

Why: under 200 steps, "every 1% of the steps" is every step, and each progress write is a
database transaction and an ε computation: on a GPU, where a step takes milliseconds, that was
most of a short job's loop. The runner now writes progress at most every PROGRESS_MIN_GAP_S
seconds (and at the last step). Prints each run's loop throughput (the report's `execution`)
and the job's started → finished seconds.

    .venv/bin/python -m bench.progress_pacing --steps 150 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from datetime import datetime
from pathlib import Path
from unittest import mock

from fastapi.testclient import TestClient

import worker.train as train_module
from bench.in_process import in_process_service
from kernel.config import Settings
from worker.runner import JobRunner


def one_job(client: TestClient, runner: JobRunner, dataset_id: str, *, steps: int, gap: float) -> tuple[float, float]:
    """(loop examples/s, job seconds) of one logistic-regression DP-SGD job with this gap."""
    spec = {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 20.0},
        "training": {"steps": steps, "batch_size": 16, "learning_rate": 0.1},
    }
    job_id = client.post("/v1/jobs", json=spec).json()["id"]
    with mock.patch.object(train_module, "PROGRESS_MIN_GAP_S", gap):
        assert runner.run(job_id) == "succeeded"
    job = client.get(f"/v1/jobs/{job_id}").json()
    loop = client.get(f"/v1/jobs/{job_id}/report").json()["execution"]["examples_per_second"]
    seconds = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])).total_seconds()
    return float(loop), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs (paced, every step), after a warm-up")
    args = parser.parse_args()
    paced_gap = train_module.PROGRESS_MIN_GAP_S
    with tempfile.TemporaryDirectory() as directory:
        settings = Settings(  # type: ignore[call-arg]
            environment="test", data_dir=Path(directory), rate_limit_per_minute=0, heartbeat_interval_s=30.0
        )
        with in_process_service(settings) as (client, db, dataset_id):
            runner = JobRunner(settings, db=db)
            one_job(client, runner, dataset_id, steps=args.steps, gap=paced_gap)  # warm-up: one-off costs
            results: dict[float, list[tuple[float, float]]] = {paced_gap: [], 0.0: []}
            for _ in range(args.rounds):
                for gap in results:
                    results[gap].append(one_job(client, runner, dataset_id, steps=args.steps, gap=gap))
    print(f"| progress writes | loop examples/s (median of {args.rounds}) | job seconds (median) |")
    print("|---|---:|---:|")
    for gap, runs in results.items():
        label = f"paced ({gap} s gap)" if gap else "every step"
        loop = statistics.median(r[0] for r in runs)
        seconds = statistics.median(r[1] for r in runs)
        print(f"| {label} | {loop:,.0f} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
