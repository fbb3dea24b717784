"""privtrain-admin revoke-key / list-keys: a deleted key answers 401 like an unknown one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from admin.cli import main
from kernel.config import Settings, get_settings
from kernel.db.engine import Database
from kernel.db.orm import ApiKey
from tests.conftest import new_key


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setenv("PRIVTRAIN_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("PRIVTRAIN_ENVIRONMENT", "test")
    get_settings.cache_clear()
    yield settings
    get_settings.cache_clear()


def _status(client: TestClient, key: str) -> int:
    return client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).status_code


def _key_row(database: Database, key: str) -> ApiKey:
    from kernel.access.keys import key_digest

    with database.read_session() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.digest == key_digest(key)))
        assert row is not None
        return row


@pytest.mark.parametrize("name_by", ["id", "key", "prefix"])
def test_revoked_key_answers_401_like_an_unknown_key(
    cli_env: Settings, app_client: TestClient, database: Database, capsys: pytest.CaptureFixture[str], name_by: str
) -> None:
    key, other = new_key(database, "carol"), new_key(database, "carol")
    row = _key_row(database, key)
    ref = {"id": row.id, "key": key, "prefix": row.prefix}[name_by]
    if name_by == "prefix" and _key_row(database, other).prefix == row.prefix:
        pytest.skip("two random keys share a prefix (2^-30)")
    assert _status(app_client, key) == 200
    assert main(["revoke-key", ref]) == 0
    assert f"revoked {row.id}" in capsys.readouterr().out
    revoked = app_client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"})
    unknown = app_client.get("/v1/datasets", headers={"Authorization": "Bearer pt_never-issued-key-000000000000"})
    assert revoked.status_code == unknown.status_code == 401
    assert revoked.json() == unknown.json()  # indistinguishable from a key that never existed
    assert _status(app_client, other) == 200  # only the named key is revoked
    assert _key_row(database, key).revoked_at is not None  # the row stays (audit trail)
    assert main(["revoke-key", ref]) == 0
    assert "already revoked" in capsys.readouterr().out


def test_revoke_key_refuses_unknown_and_ambiguous_references(
    cli_env: Settings, app_client: TestClient, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key(database, "carol")
    assert main(["revoke-key", "key_does_not_exist"]) == 1
    assert "no such API key" in capsys.readouterr().err
    assert main(["revoke-key", "pt_"]) == 1  # not a prefix match: prefixes are 8 characters
    new_key(database, "dave")
    with database.write_transaction() as tx:  # force both keys onto one prefix
        for row in tx.scalars(select(ApiKey)):
            row.prefix = "pt_same0"
    assert main(["revoke-key", "pt_same0"]) == 2
    assert "share this prefix" in capsys.readouterr().err
    assert _status(app_client, key) == 200


def test_list_keys_shows_ids_and_states_but_never_keys(
    cli_env: Settings, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    key = new_key(database, "carol")
    row = _key_row(database, key)
    assert main(["revoke-key", row.id]) == 0
    capsys.readouterr()
    assert main(["list-keys", "--tenant", "carol"]) == 0
    out = capsys.readouterr().out
    assert row.id in out and "tenant=carol" in out and "revoked" in out
    assert key not in out
