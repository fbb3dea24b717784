"""Upload limits through the API: concurrent-upload caps (429) and NPZ amplification (422)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.limits.upload_slots import UploadSlots, UploadSlotsFull, slots_of
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Tenant
from tests.conftest import upload


def _slots(client: TestClient, settings: Settings) -> UploadSlots:
    return slots_of(
        client.app,  # type: ignore[arg-type]
        total=settings.max_concurrent_uploads,
        per_tenant=settings.max_concurrent_uploads_per_tenant,
    )


def _tenant_id(database: Database, name: str) -> str:
    with database.read_session() as session:
        tenant_id = session.scalar(select(Tenant.id).where(Tenant.name == name))
    assert tenant_id is not None
    return tenant_id


def _n_datasets(database: Database) -> int:
    with database.read_session() as session:
        return session.scalar(select(func.count()).select_from(Dataset)) or 0


def test_slots_are_bounded_per_tenant_and_in_total() -> None:
    slots = UploadSlots(total=3, per_tenant=2)
    slots.acquire("a")
    slots.acquire("a")
    with pytest.raises(UploadSlotsFull) as caught:
        slots.acquire("a")
    assert caught.value.scope == "per-tenant" and caught.value.limit == 2
    slots.acquire("b")
    with pytest.raises(UploadSlotsFull) as caught:
        slots.acquire("c")
    assert caught.value.scope == "total" and caught.value.limit == 3
    slots.release("a")
    slots.acquire("c")
    assert slots.in_flight() == 3 and slots.in_flight("a") == 1
    for tenant in ("a", "b", "c"):
        slots.release(tenant)
    assert slots.in_flight() == 0
    with pytest.raises(RuntimeError):
        slots.release("a")


def test_total_cap_answers_429_with_retry_after(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    slots = _slots(alice, settings)
    others = [f"other-{i}" for i in range(settings.max_concurrent_uploads)]
    for other in others:
        slots.acquire(other)
    refused = upload(alice, digits_csv)
    assert refused.status_code == 429, refused.text  # type: ignore[attr-defined]
    assert refused.headers["Retry-After"] == "10"  # type: ignore[attr-defined]
    problem = refused.json()  # type: ignore[attr-defined]
    assert problem["type"] == "/problems/too-many-uploads" and problem["scope"] == "total"
    assert _n_datasets(database) == 0
    for other in others:
        slots.release(other)
    assert upload(alice, digits_csv).status_code == 201  # type: ignore[attr-defined]
    assert slots.in_flight() == 0


def test_per_tenant_cap_leaves_other_tenants_free(
    alice: TestClient,
    settings: Settings,
    database: Database,
    digits_csv: bytes,
    bob_headers: dict[str, str],
) -> None:
    slots = _slots(alice, settings)
    alice_id = _tenant_id(database, "alice")
    for _ in range(settings.max_concurrent_uploads_per_tenant):
        slots.acquire(alice_id)
    refused = upload(alice, digits_csv)
    assert refused.status_code == 429  # type: ignore[attr-defined]
    assert refused.json()["scope"] == "per-tenant"  # type: ignore[attr-defined]
    query = {"name": "d", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    other = alice.post("/v1/datasets", params=query, content=digits_csv, headers=bob_headers)
    assert other.status_code == 201, other.text
    assert slots.in_flight(alice_id) == settings.max_concurrent_uploads_per_tenant


def test_refused_upload_releases_its_slot(alice: TestClient, settings: Settings, database: Database) -> None:
    slots = _slots(alice, settings)
    assert upload(alice, b"not,a\ncsv").status_code == 422  # type: ignore[attr-defined]
    assert slots.in_flight() == 0


def test_npz_over_the_compression_ratio_is_an_invalid_dataset(alice: TestClient, database: Database) -> None:
    buffer = io.BytesIO()
    n_rows = 96 * 1024**2 // (4 * 64)
    np.savez_compressed(buffer, X=np.zeros((n_rows, 64), np.float32), y=np.zeros(n_rows, np.int8))
    response = upload(alice, buffer.getvalue(), format="npz", label_column=None)
    assert response.status_code == 422, response.text  # type: ignore[attr-defined]
    problem = response.json()  # type: ignore[attr-defined]
    assert problem["type"] == "/problems/invalid-dataset"
    assert problem["reason"] == "too-large-decompressed"
    assert "compression ratio limit is 200" in problem["detail"]
    assert _n_datasets(database) == 0
