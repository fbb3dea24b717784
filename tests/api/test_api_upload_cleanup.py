"""Upload exit paths leave exactly the blobs that registered datasets reference, and no temp files.

Blobs are content-addressed and shared: an upload that fails must delete the blob it created
unless a dataset row references it, and must never delete a blob a registered dataset uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

import kernel.datasets.registration as registration
import kernel.datasets.upload_validation as upload_validation
from kernel.db.engine import Database
from kernel.db.orm import Dataset
from kernel.services import Services
from kernel.storage.references import discard_unreferenced_blob
from tests.conftest import upload


def _services(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def _blob_keys(services: Services) -> set[str]:
    root, tmp = services.blobs.root, services.blobs.tmp_dir
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file() and tmp not in path.parents}


def _referenced_keys(database: Database) -> set[str]:
    with database.read_session() as session:
        return set(session.scalars(select(Dataset.blob_key)))


def _temp_files(services: Services) -> list[Path]:
    tmp = services.blobs.tmp_dir
    return [path for path in tmp.rglob("*") if path.is_file()] if tmp.exists() else []


def _assert_only_referenced_blobs(client: TestClient, database: Database) -> None:
    services = _services(client)
    assert _blob_keys(services) == _referenced_keys(database)
    assert _temp_files(services) == []


@pytest.fixture
def parse_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both uploads finish parsing before either registers: the race, made deterministic."""
    barrier = threading.Barrier(2, timeout=30)
    parse: Callable[..., Any] = upload_validation.parse_dataset

    def parse_then_wait(*args: Any, **kwargs: Any) -> Any:
        parsed = parse(*args, **kwargs)
        barrier.wait()
        return parsed

    monkeypatch.setattr(upload_validation, "parse_dataset", parse_then_wait)


def _post(client: TestClient, body: bytes, *, name: str = "digits") -> int:
    params = {"name": name, "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    response = client.post("/v1/datasets", params=params, content=body, headers={"Idempotency-Key": "k"})
    return response.status_code


def _race(client: TestClient, uploads: list[tuple[bytes, str]]) -> list[int]:
    """The uploads at once, all with the same Idempotency-Key; their statuses, sorted."""
    with ThreadPoolExecutor(max_workers=len(uploads)) as pool:
        return sorted(pool.map(lambda u: _post(client, u[0], name=u[1]), uploads))


def _other_body(body: bytes) -> bytes:
    return body + body.splitlines(keepends=True)[1]  # one more row: other bytes, still valid


@pytest.mark.usefixtures("parse_together")
def test_same_key_different_body_race_leaves_no_blob_of_the_refused_upload(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    statuses = _race(alice, [(digits_csv, "digits"), (_other_body(digits_csv), "digits")])
    assert statuses == [201, 422]
    _assert_only_referenced_blobs(alice, database)
    assert len(_blob_keys(_services(alice))) == 1


@pytest.mark.usefixtures("parse_together")
def test_same_key_same_bytes_race_keeps_the_one_shared_blob(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    assert _race(alice, [(digits_csv, "digits"), (digits_csv, "digits")]) == [200, 201]
    _assert_only_referenced_blobs(alice, database)
    assert len(_blob_keys(_services(alice))) == 1


@pytest.mark.usefixtures("parse_together")
def test_same_key_same_bytes_other_parameters_keeps_the_registered_blob(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    """The refused request may be the one that wrote the blob; the registered dataset keeps it."""
    assert _race(alice, [(digits_csv, "first"), (digits_csv, "second")]) == [201, 422]
    _assert_only_referenced_blobs(alice, database)
    assert len(_blob_keys(_services(alice))) == 1


def test_a_failure_inside_the_registration_removes_the_new_blob(
    alice: TestClient, database: Database, digits_csv: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(registration.ledger, "open_budget", broken)
    client = TestClient(alice.app, raise_server_exceptions=False)
    client.headers.update(alice.headers)
    assert upload(client, digits_csv).status_code == 500
    _assert_only_referenced_blobs(alice, database)
    assert _blob_keys(_services(alice)) == set()


def test_discard_keeps_a_referenced_blob_and_deletes_an_unreferenced_one(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    services = _services(alice)
    assert upload(alice, digits_csv).status_code == 201
    (referenced,) = _referenced_keys(database)
    stray, _ = services.blobs.put_bytes(b"no dataset uses these bytes")
    for key in (referenced, stray):
        discard_unreferenced_blob(services.db, services.blobs, key=key)
    assert _blob_keys(services) == {referenced}
