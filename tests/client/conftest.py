"""Fixtures: the real app in-process behind an httpx transport, and a worker thread for jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain import Client
from tests.conftest import new_key

BASE_URL = "http://privtrain.test"


class AppTransport(httpx.BaseTransport):
    """Hands the client's requests to the in-process app through FastAPI's TestClient."""

    def __init__(self, app_client: TestClient) -> None:
        self.app_client = app_client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.app_client.send(request)
        return httpx.Response(response.status_code, headers=response.headers.raw, content=response.content)


def wrap(
    inner: httpx.BaseTransport, handler: Callable[[httpx.Request, httpx.BaseTransport], httpx.Response]
) -> httpx.MockTransport:
    """An httpx MockTransport that decides per request whether to fail or pass it on to the app."""
    return httpx.MockTransport(lambda request: handler(request, inner))


@dataclass
class WorkerThreads:
    """The dispatcher: records jobs and, when ``run`` is set, trains each with the worker's
    JobRunner in a background thread (the same code the Celery worker runs)."""

    settings: Settings
    database: Database
    run: bool = False
    sent: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None:
        self.sent.append(job_id)
        if self.run:
            thread = threading.Thread(target=self._train, args=(job_id,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None:
        """A tuning's slot: run like a job, in a thread of its own (slots of one tuning overlap, as
        on several workers)."""
        name = f"{job_id}.slot.{attempt}.{slot}"
        self.sent.append(name)
        if self.run:
            thread = threading.Thread(target=self._run_slot, args=(job_id, attempt, slot, name), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _runner(self) -> Any:
        from worker.runner import JobRunner  # torch: only the tests that train need it

        return JobRunner(self.settings, db=self.database, dispatcher=self)

    def _train(self, job_id: str) -> None:
        self.outcomes[job_id] = self._runner().run(job_id)

    def _run_slot(self, job_id: str, attempt: int, slot: int, name: str) -> None:
        self.outcomes[name] = self._runner().run_slot(job_id, attempt=attempt, slot=slot)

    def join(self) -> None:
        """Every thread started, including those started by the threads (a tuning's slots)."""
        joined = 0
        while joined < len(self.threads):
            self.threads[joined].join(timeout=120)
            joined += 1


@pytest.fixture
def dispatcher(settings: Settings, database: Database) -> Iterator[WorkerThreads]:
    workers = WorkerThreads(settings, database)
    yield workers
    workers.join()


@pytest.fixture
def api_key(database: Database) -> str:
    return new_key(database, "alice")


@pytest.fixture
def transport(app_client: TestClient) -> AppTransport:
    return AppTransport(app_client)


@pytest.fixture
def sleeps() -> list[float]:
    return []


def recording_sleep(sleeps: list[float]) -> Callable[[float], None]:
    """Record what the client asked to wait; wait at most 20 ms so tests stay fast."""

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(min(seconds, 0.02))

    return sleep


@pytest.fixture
def client(transport: AppTransport, api_key: str, sleeps: list[float]) -> Iterator[Client]:
    with Client(BASE_URL, api_key, timeout=10, max_retries=3, transport=transport, sleep=recording_sleep(sleeps)) as c:
        yield c


@pytest.fixture
def digits_path(tmp_path, digits_csv: bytes):  # noqa: ANN001, ANN201 - pytest fixtures
    path = tmp_path / "digits.csv"
    path.write_bytes(digits_csv)
    return path


def tiny_spec(dataset_id: str, *, noise_multiplier: float = 5.0) -> dict:
    """A job that trains in well under a second: 4 steps of logistic regression on digits. A fixed
    σ keeps pricing cheap (no calibration search); σ = 5 costs little of the budget."""
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": noise_multiplier},
        "training": {"steps": 4, "batch_size": 256, "learning_rate": 0.5},
    }
