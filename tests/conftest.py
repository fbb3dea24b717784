"""Shared fixtures: an isolated data dir per test, a migrated database, API clients per tenant."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.main import create_app
from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry

pytest_plugins = ["tests.object_store"]  # object_store_server, s3_bucket


@pytest.fixture(autouse=True)
def _restore_root_logging() -> Iterator[None]:
    """Entry points under test (``privtrain-admin`` commands run in-process) configure logging
    for the process; put the root logger back so a handler bound to one test's stderr does not
    write into a later test's captured output."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@dataclass
class RecordingDispatcher:
    """Stands in for Celery in API tests: records what would have been sent."""

    sent: list[str] = field(default_factory=list)
    queues: dict[str, str | None] = field(default_factory=dict)
    slots: list[tuple[str, int, int]] = field(default_factory=list)
    """(job id, attempt, slot) of every tuning slot sent."""

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None:
        self.sent.append(job_id)
        self.queues[job_id] = queue

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None:
        self.slots.append((job_id, attempt, slot))
        self.queues[f"{job_id}.slot.{attempt}.{slot}"] = queue


def make_settings(data_dir: Path, **overrides: object) -> Settings:
    # Tests poll as fast as they like; the rate limiter has its own tests (test_api_limits.py). A
    # tuning's slots last its trial time limit plus a 2 s margin (the service's is 30 s).
    values: dict[str, object] = {
        "environment": "test",
        "data_dir": data_dir,
        "rate_limit_per_minute": 0,
        "tuning_slot_margin_s": 2.0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    settings = make_settings(tmp_path / "data", max_upload_bytes=5_000_000)
    migrate(settings)
    return settings


@pytest.fixture
def database(settings: Settings) -> Iterator[Database]:
    db = Database(settings.resolved_database_url)
    yield db
    db.dispose()


def new_key(db: Database, tenant: str) -> str:
    key = generate_api_key()
    with db.write_transaction() as session:
        register_api_key(session, tenant=get_or_create_tenant(session, tenant), key=key)
    return key


@pytest.fixture
def dispatcher() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def app_client(settings: Settings, dispatcher: RecordingDispatcher) -> Iterator[TestClient]:
    app = create_app(settings, dispatcher=dispatcher)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def alice(app_client: TestClient, database: Database) -> TestClient:
    app_client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
    return app_client


@pytest.fixture
def bob_headers(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'bob')}"}


def digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn's digits, scaled to [0, 1] by the public pixel range 16, split 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    X = digits.data / 16.0
    return tuple(train_test_split(X, digits.target, test_size=0.2, random_state=seed, stratify=digits.target))  # type: ignore[return-value]


def to_csv(X: np.ndarray, y: np.ndarray, *, label: str = "label") -> bytes:
    buffer = io.StringIO()
    header = [f"x{i}" for i in range(X.shape[1])] + [label]
    buffer.write(",".join(header) + "\n")
    for row, target in zip(X, y, strict=True):
        buffer.write(",".join(repr(float(v)) for v in row) + f",{int(target)}\n")
    return buffer.getvalue().encode()


@pytest.fixture(scope="session")
def digits_csv() -> bytes:
    X_train, _, y_train, _ = digits_split()
    return to_csv(X_train, y_train)


def upload(client: TestClient, body: bytes, **params: object) -> object:
    query = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    query.update(params)
    return client.post("/v1/datasets", params=query, content=body)


def dp_sgd_spec(dataset_id: str, **privacy: object) -> dict[str, object]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0, "momentum": 0.9}},
        "privacy": privacy or {"target_epsilon": 4.0},
        "training": {"epochs": 2, "batch_size": 64, "learning_rate": 0.5},
    }


def spec_for(dataset_id: str, name: str, hyperparameters: dict | None = None, **privacy: object) -> dict:
    """A small logistic-regression job spec for algorithm `name` (target ε 4 unless given)."""
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": name, "hyperparameters": hyperparameters or {}},
        "privacy": privacy or {"target_epsilon": 4.0},
        "training": {"epochs": 2, "batch_size": 64, "learning_rate": 0.5},
    }


def counts(database: Database) -> tuple[int, int]:
    """(jobs, ledger entries) stored: what a refused request must leave unchanged."""
    with database.read_session() as session:
        return (
            session.scalar(select(func.count()).select_from(Job)) or 0,
            session.scalar(select(func.count()).select_from(LedgerEntry)) or 0,
        )
