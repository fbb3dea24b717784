"""PostgreSQL unreachable for a while: 503 problems (never a hang, never a 500), /readyz names the
database, and the API recovers by itself when it comes back (issue 7, faults)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from tests.conftest import RecordingDispatcher, make_settings, new_key
from tests.fault_proxy import FaultProxy

pytestmark = pytest.mark.services


def test_api_answers_503_while_postgres_is_down_and_recovers(postgres_url: str, tmp_path: Path) -> None:
    real = make_url(postgres_url)
    proxy = FaultProxy(real.host or "127.0.0.1", real.port or 5432)
    proxy.start()
    via_proxy = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    settings = make_settings(tmp_path / "data", database_url=via_proxy, run_reconciler=False)
    migrate(settings)
    db = Database(via_proxy)
    key = new_key(db, "outage")
    try:
        with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
            client.headers["Authorization"] = f"Bearer {key}"
            assert client.get("/v1/datasets").status_code == 200
            assert client.get("/readyz").json()["checks"]["database"] == "ok"

            proxy.cut()
            for path in ("/v1/datasets", "/v1/jobs", "/v1/algorithms"):  # all authenticate: I/O
                started = time.monotonic()
                response = client.get(path)
                elapsed = time.monotonic() - started
                assert response.status_code == 503, (path, response.status_code, response.text)
                assert response.headers["content-type"].startswith("application/problem+json")
                assert response.json()["type"] == "/problems/database-unavailable"
                assert response.headers["Retry-After"] == "5"
                assert elapsed < 15, f"{path} took {elapsed:.1f} s: an outage must not hang requests"
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["checks"]["database"].startswith("unavailable")
            assert client.get("/healthz").status_code == 200  # liveness does no I/O

            proxy.start()  # the database is back: no restart, no manual step
            deadline = time.monotonic() + 30
            while client.get("/v1/datasets").status_code != 200:
                assert time.monotonic() < deadline, "the API did not recover by itself"
                time.sleep(0.2)
            assert client.get("/readyz").status_code == 200
    finally:
        proxy.cut()
        db.dispose()
