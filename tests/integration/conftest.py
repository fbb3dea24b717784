"""The embedded mode with a real worker process, shared by the integration tests of a module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from tests.conftest import make_settings, new_key
from tests.worker_process import running_worker


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Path, Database]]:
    root = tmp_path_factory.mktemp("embedded")
    settings = make_settings(root / "data", heartbeat_interval_s=0.2, checkpoint_every_steps=50)
    migrate(settings)
    db = Database(settings.resolved_database_url)
    log_path = root / "worker.log"
    with running_worker(settings, log_path), TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(db, 'alice')}"
        yield client, log_path, db
    db.dispose()
