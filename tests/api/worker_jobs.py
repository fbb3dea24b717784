"""Helpers of API tests that run a job on the worker's JobRunner in process."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from tests.unit.ingest.image_fixtures import image_zip
from worker.runner import JobRunner


def upload_shapes(alice: TestClient, **params: object) -> str:
    """The image-fixture ZIP (two classes of 8×8 PNGs) resized to 16×16; ε 8 unless ``params`` say otherwise."""
    query: dict[str, object] = {"name": "shapes", "format": "zip", "image_size": "16", "classes": "dark,light"}
    query.update(params or {"epsilon": 8, "delta": 1e-3})
    response = alice.post("/v1/datasets", params=query, content=image_zip())
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def run_on_worker(alice: TestClient, settings: Settings, database: Database, spec: dict[str, Any]) -> str:
    """Submit ``spec`` and run it to success on an in-process JobRunner; the job's id."""
    submitted = alice.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    job_id = str(submitted.json()["id"])
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    return job_id
