"""The worker builds a job's model before it takes the database write lock (issue 13: a large
model built under SQLite's write lock made another tenant's upload fail with 503)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from tests.conftest import dp_sgd_spec
from worker import model_setup
from worker.runner import JobRunner


def test_no_write_lock_is_held_while_the_model_is_built(
    alice: TestClient,
    settings: Settings,
    database: Database,
    dataset_id: str,
) -> None:
    spec = dp_sgd_spec(dataset_id, noise_multiplier=2.0)
    spec["training"] = {"steps": 2, "batch_size": 64, "learning_rate": 0.5}
    job = alice.post("/v1/jobs", json=spec).json()
    runner = JobRunner(settings, db=database)
    building, release = threading.Event(), threading.Event()
    build = model_setup.fresh_model

    def slow_build(*args: Any, **kwargs: Any) -> torch.nn.Module:
        building.set()
        assert release.wait(30), "the test never released the build"
        return build(*args, **kwargs)

    claimed: list[object] = []
    claimer = threading.Thread(target=lambda: claimed.append(runner.claim(job["id"])))
    patched = mock.patch.object(model_setup, "fresh_model", slow_build)
    patched.start()
    claimer.start()
    try:
        assert building.wait(30)
        other_writer = sqlite3.connect(
            Path(settings.resolved_database_url.removeprefix("sqlite:///")), isolation_level=None, timeout=0.5
        )
        try:
            other_writer.execute("BEGIN IMMEDIATE")  # 'database is locked' if the claim held the lock
            other_writer.execute("ROLLBACK")
        finally:
            other_writer.close()
    finally:
        release.set()
        claimer.join(timeout=60)
        patched.stop()
    assert claimed and claimed[0] is not None
    assert alice.get(f"/v1/jobs/{job['id']}").json()["status"] == "running"
