"""Progress writes are paced: every 1% of the steps or heartbeat, but never twice within
PROGRESS_MIN_GAP_S, and always at the last step. Each write is a database transaction and an ε
computation; a short job with fast steps must not pay them on every step."""

from __future__ import annotations

import math
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

import worker.train as train_module
from kernel.config import Settings
from kernel.db.engine import Database
from tests.conftest import dp_sgd_spec, upload
from worker.runner import JobRunner

STEPS = 150  # under 200 steps, 1% of the steps is every step


def _run(alice: TestClient, settings: Settings, database: Database, digits_csv: bytes) -> tuple[list[int], float]:
    dataset = upload(alice, digits_csv).json()
    spec = dp_sgd_spec(dataset["id"], noise_multiplier=5.0)
    spec["training"] = {"steps": STEPS, "batch_size": 16, "learning_rate": 0.1}
    job_id = alice.post("/v1/jobs", json=spec).json()["id"]
    paced = settings.model_copy(update={"heartbeat_interval_s": 30.0})
    assert JobRunner(paced, db=database).run(job_id) == "succeeded"
    job = alice.get(f"/v1/jobs/{job_id}").json()
    events = alice.get(f"/v1/jobs/{job_id}/events").json()
    steps = [e["payload"]["step"] for e in events if e["kind"] == "progress"]
    seconds = (datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])).total_seconds()
    return steps, seconds


def test_a_short_fast_job_writes_progress_at_most_twice_a_second_and_at_its_last_step(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    steps, seconds = _run(alice, settings, database, digits_csv)
    assert steps and steps[-1] == STEPS and steps == sorted(set(steps))
    assert len(steps) <= 2 + math.ceil(seconds / train_module.PROGRESS_MIN_GAP_S)
    assert len(steps) < STEPS


def test_without_the_gap_every_step_would_write(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the pacing above is the gap's doing (1% of 150 steps is every step)."""
    monkeypatch.setattr(train_module, "PROGRESS_MIN_GAP_S", 0.0)
    steps, _ = _run(alice, settings, database, digits_csv)
    assert steps == list(range(1, STEPS + 1))
