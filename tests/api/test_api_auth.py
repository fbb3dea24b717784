"""Authentication: keys as digests, 401 problems, bootstrap key."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from kernel.access.keys import key_digest
from kernel.bootstrap import ensure_embedded_key, migrate
from kernel.db.engine import Database
from kernel.db.orm import ApiKey
from tests.conftest import RecordingDispatcher, make_settings


@pytest.mark.parametrize(
    "header",
    [None, "Bearer", "Basic abc", "Bearer pt_not-a-real-key", "pt_missing-scheme"],
)
def test_requests_without_a_valid_key_are_401(app_client: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    for method, path in (("get", "/v1/datasets"), ("get", "/v1/algorithms"), ("post", "/v1/jobs")):
        response = getattr(app_client, method)(path, headers=headers)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["type"] == "/problems/unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"


def test_keys_are_stored_as_digests_only(alice: TestClient, database: Database) -> None:
    key = alice.headers["Authorization"].split()[1]
    with database.read_session() as session:
        stored = session.scalars(select(ApiKey)).all()
    assert [k.digest for k in stored] == [key_digest(key)]
    assert all(key not in (k.digest, k.prefix, k.label) for k in stored)


def test_embedded_key_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    migrate(settings)
    db = Database(settings.resolved_database_url)
    key, path = ensure_embedded_key(settings, db)
    assert path.stat().st_mode & 0o777 == 0o600
    again, _ = ensure_embedded_key(settings, db)
    assert again == key
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
        assert client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_bootstrap_env_key_is_registered_at_start(tmp_path: Path) -> None:
    key = "pt_" + "b" * 40
    settings = make_settings(tmp_path / "data", bootstrap_api_key=key)
    migrate(settings)
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
        assert client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_short_bootstrap_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        make_settings(tmp_path, bootstrap_api_key="short")


def test_production_refuses_embedded_defaults(tmp_path: Path) -> None:
    from kernel.config import UnsafeSettingsError

    with pytest.raises(UnsafeSettingsError):
        create_app(make_settings(tmp_path, environment="production"), dispatcher=RecordingDispatcher())
