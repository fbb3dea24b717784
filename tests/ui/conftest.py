"""One small world for the HTML report and dashboard tests, built once per session: two tenants,
a dataset with a hostile name, a job run to success in-process by the worker's JobRunner (with a
released DP metric, so every report section is filled), a queued job and a raised budget. The
browser tests build a second one with a plain name for the screenshots of docs/reports-and-dashboard.md."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from tests.conftest import RecordingDispatcher, make_settings, new_key, to_csv

HOSTILE_NAME = "<img src=x onerror=alert(1)> & \"quoted\" 'single' <b>"


@dataclass(frozen=True)
class UiWorld:
    settings: Settings
    db: Database
    app: FastAPI
    alice_key: str
    bob_key: str
    dataset_id: str
    job_id: str
    queued_job_id: str

    def client(self, key: str | None = None) -> TestClient:
        """A fresh client (its own cookie jar); with ``key``, Bearer-authenticated."""
        client = TestClient(self.app, follow_redirects=False)
        if key:
            client.headers["Authorization"] = f"Bearer {key}"
        return client

    def upload_dataset(self, key: str, *, name: str, epsilon: float = 8.0) -> str:
        """A new dataset of the key's tenant (300 rows, 4 features, two classes); its id."""
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big"))  # distinct bytes
        X = rng.random((300, 4))
        y = (X[:, 0] > 0.5).astype(int)
        response = self.client(key).post(
            "/v1/datasets",
            content=to_csv(X, y),
            params={"name": name, "format": "csv", "label_column": "label", "epsilon": epsilon, "delta": 1e-5},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def submit_job(self, key: str, *, dataset_id: str, steps: int = 10) -> str:
        """A queued job (the test app's dispatcher only records it; nothing runs it)."""
        response = self.client(key).post("/v1/jobs", json=job_spec(dataset_id, steps=steps, evaluation=False))
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    def invite(self, owner_key: str, *, dataset_id: str, tenant: str) -> None:
        response = self.client(owner_key).post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": tenant})
        assert response.status_code == 202, response.text

    def logged_in(self, key: str) -> TestClient:
        """A browser-like client that logged in through the form."""
        client = self.client()
        page = client.get("/ui/login")
        token = csrf_token_of(page.text)
        response = client.post("/ui/login", data={"csrf_token": token, "api_key": key})
        assert response.status_code == 303, response.text
        return client


def csrf_token_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def job_spec(dataset_id: str, *, steps: int, evaluation: bool) -> dict[str, object]:
    spec: dict[str, object] = {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": 2.0},
        "training": {"steps": steps, "batch_size": 32, "learning_rate": 0.5},
    }
    if evaluation:
        spec["evaluation"] = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5}
    return spec


@contextmanager
def built_world(root: Path, *, dataset_name: str) -> Iterator[UiWorld]:
    """Tenants alice and bob; alice's dataset (budget raised once), one job run to success by the
    worker's JobRunner in-process, one queued job."""
    import torch

    from worker.runner import JobRunner

    torch.set_num_threads(1)
    settings = make_settings(
        root / "data",
        run_reconciler=False,
        sse_poll_interval_s=0.05,
        sse_keepalive_s=0.2,
        sse_max_stream_s=2.0,
    )
    migrate(settings)
    db = Database(settings.resolved_database_url)
    alice_key, bob_key = new_key(db, "alice"), new_key(db, "bob")
    app = create_app(settings, dispatcher=RecordingDispatcher())
    rng = np.random.default_rng(0)
    X = rng.random((300, 4))
    y = (X[:, 0] > 0.5).astype(int)
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {alice_key}"
        dataset = client.post(
            "/v1/datasets",
            content=to_csv(X, y),
            params={"name": dataset_name, "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
        )
        assert dataset.status_code == 201, dataset.text
        dataset_id = dataset.json()["id"]
        raised = client.post(f"/v1/datasets/{dataset_id}/budget", json={"epsilon": 9.0, "reason": "owner raised <it>"})
        assert raised.status_code == 200, raised.text
        job = client.post("/v1/jobs", json=job_spec(dataset_id, steps=30, evaluation=True))
        assert job.status_code == 202, job.text
        assert JobRunner(settings, db=db).run(job.json()["id"]) == "succeeded"
        queued = client.post("/v1/jobs", json=job_spec(dataset_id, steps=10, evaluation=False))
        assert queued.status_code == 202, queued.text
        yield UiWorld(
            settings=settings,
            db=db,
            app=app,
            alice_key=alice_key,
            bob_key=bob_key,
            dataset_id=dataset_id,
            job_id=job.json()["id"],
            queued_job_id=queued.json()["id"],
        )
    db.dispose()


@pytest.fixture(scope="session")
def ui_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiWorld]:
    with built_world(tmp_path_factory.mktemp("ui"), dataset_name=HOSTILE_NAME) as world:
        yield world


@pytest.fixture(scope="session")
def report_json(ui_world: UiWorld) -> dict:
    response = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{ui_world.job_id}/report")
    assert response.status_code == 200
    return response.json()


@pytest.fixture(scope="session")
def report_html(ui_world: UiWorld) -> str:
    response = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{ui_world.job_id}/report", params={"format": "html"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    return response.text
