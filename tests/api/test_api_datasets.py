"""Dataset upload through the API: validation, budget, tenant scoping, nothing left behind."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, PrivacyBudget
from tests.conftest import upload


def blob_files(settings: Settings) -> list[Path]:
    return [p for p in settings.blob_dir.rglob("*") if p.is_file()]


def tmp_files(settings: Settings) -> list[Path]:
    return [p for p in settings.tmp_dir.rglob("*") if p.is_file()]


def test_csv_upload_records_public_facts(alice: TestClient, digits_csv: bytes, settings: Settings) -> None:
    response = upload(alice, digits_csv)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["n_rows"] == 1437
    assert body["feature_shape"] == [64]
    assert body["task"] == "classification"
    assert body["n_classes"] == 10
    assert body["feature_names"] == [f"x{i}" for i in range(64)]
    assert body["budget"] == {"epsilon": 8.0, "delta": 1e-5}
    import hashlib

    assert body["sha256"] == hashlib.sha256(digits_csv).hexdigest()
    assert len(blob_files(settings)) == 1 and not tmp_files(settings)
    assert alice.get(f"/v1/datasets/{body['id']}").json()["sha256"] == body["sha256"]


def test_npz_upload_images(alice: TestClient) -> None:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, X=rng.random((200, 1, 28, 28), dtype=np.float32), y=rng.integers(0, 10, 200))
    response = upload(alice, buffer.getvalue(), format="npz", label_column=None, delta=1e-3)
    assert response.status_code == 201, response.text
    assert response.json()["feature_shape"] == [1, 28, 28]


def _assert_nothing_stored(database: Database, settings: Settings) -> None:
    with database.read_session() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == 0
        assert session.scalar(select(func.count()).select_from(PrivacyBudget)) == 0
    assert blob_files(settings) == [] and tmp_files(settings) == []


@pytest.mark.parametrize(
    ("body", "params", "status", "slug", "reason"),
    [
        (b"a,label\n1,0\n2\n", {}, 422, "invalid-dataset", "ragged-row"),
        (b"a,label\n1,0\nfoo,1\n", {}, 422, "invalid-dataset", "non-numeric"),
        (b"a,label\n1,0\nnan,1\n", {}, 422, "invalid-dataset", "non-finite"),
        (b"a,b\n1,0\n2,1\n", {}, 422, "invalid-dataset", "missing-label-column"),
        (b"a,label\n", {}, 422, "invalid-dataset", "empty-dataset"),
        (b"a,label\n1,0.5\n2,1.5\n", {"task": "classification"}, 422, "invalid-dataset", "bad-labels"),
        (b"a,label\n1,0\n2,1\n", {"format": "parquet"}, 422, "invalid-dataset", "unknown-format"),
        (b"a,label\n1,0\n2,1\n", {"delta": 0.6}, 422, "invalid-budget", None),
        (b"a,label\n1,0\n2,1\n", {"epsilon": 0}, 422, "validation-error", None),
        (b"a,label\n1,0\n2,1\n", {"epsilon": -1}, 422, "validation-error", None),
        (b"a,label\n1,0\n2,1\n", {"name": "../etc/passwd"}, 422, "invalid-dataset-name", None),
        (b"a,label\n1,0\n2,1\n", {"name": "bad\x07name"}, 422, "invalid-dataset-name", None),
    ],
)
def test_bad_uploads_get_problems_and_leave_nothing(
    alice: TestClient,
    database: Database,
    settings: Settings,
    body: bytes,
    params: dict[str, object],
    status: int,
    slug: str,
    reason: str | None,
) -> None:
    response = upload(alice, body, **params)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == f"/problems/{slug}"
    assert problem["status"] == status and problem["detail"]
    if reason is not None:
        assert problem["reason"] == reason
    _assert_nothing_stored(database, settings)


def test_upload_over_size_limit_is_413(alice: TestClient, database: Database, settings: Settings) -> None:
    body = b"a,label\n" + b"1,0\n" * 2_000_000  # 8 MB > 5 MB limit of the test settings
    response = upload(alice, body)
    assert response.status_code == 413
    assert response.json()["type"] == "/problems/payload-too-large"
    _assert_nothing_stored(database, settings)


def test_streamed_upload_over_limit_without_content_length(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    def chunks() -> Iterator[bytes]:
        yield b"a,label\n"
        for _ in range(700):
            yield b"1,0\n" * 2048  # ~5.7 MB in total

    response = alice.post(
        "/v1/datasets",
        params={"name": "x", "format": "csv", "label_column": "label", "epsilon": 1, "delta": 1e-9},
        content=chunks(),
    )
    assert response.status_code == 413
    _assert_nothing_stored(database, settings)


def test_datasets_are_tenant_scoped(alice: TestClient, digits_csv: bytes, bob_headers: dict[str, str]) -> None:
    dataset_id = upload(alice, digits_csv).json()["id"]
    for path in ("", "/budget", "/ledger"):
        response = alice.get(f"/v1/datasets/{dataset_id}{path}", headers=bob_headers)
        assert response.status_code == 404
        assert response.json()["type"] == "/problems/not-found"
    assert alice.get("/v1/datasets", headers=bob_headers).json()["items"] == []


def test_list_paginates(alice: TestClient) -> None:
    ids = set()
    for i in range(5):
        body = f"a,label\n1,0\n2,1\n{i},0\n".encode()  # one content, one dataset: vary the bytes
        ids.add(upload(alice, body, name=f"d{i}", delta=0.1).json()["id"])
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = alice.get("/v1/datasets", params=params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 5 and set(seen) == ids
    assert alice.get("/v1/datasets", params={"cursor": "!!"}).status_code == 422


def test_fresh_budget_view(alice: TestClient, digits_csv: bytes) -> None:
    dataset_id = upload(alice, digits_csv).json()["id"]
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["epsilon"] == 8.0 and budget["delta"] == 1e-5
    assert budget["committed_epsilon"] == 0.0 and budget["reserved_epsilon"] == 0.0
    assert budget["remaining_epsilon"] == pytest.approx(8.0, rel=1e-4)
    assert len(budget["per_order"]) >= 15
    assert alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"] == []


def test_upload_with_an_idempotency_key_registers_once(
    alice: TestClient, database: Database, settings: Settings, digits_csv: bytes
) -> None:
    headers = {"Idempotency-Key": "upload-2026-11-21"}
    first = alice.post(
        "/v1/datasets",
        headers=headers,
        content=digits_csv,
        params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
    )
    again = alice.post(
        "/v1/datasets",
        headers=headers,
        content=digits_csv,
        params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
    )
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    blobs_before = sorted(p.name for p in settings.blob_dir.rglob("*") if p.is_file())
    other = alice.post(
        "/v1/datasets",
        headers=headers,
        content=digits_csv,
        params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 4, "delta": 1e-5},
    )
    assert other.status_code == 422 and other.json()["type"] == "/problems/idempotency-key-reused"
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(Dataset)) == 1
        assert session.scalar(select(func.count()).select_from(PrivacyBudget)) == 1
    assert sorted(p.name for p in settings.blob_dir.rglob("*") if p.is_file()) == blobs_before
    assert not [p for p in settings.tmp_dir.rglob("*") if p.is_file()]  # no temp file left behind
