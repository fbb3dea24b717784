"""Rate limits per API key and the per-tenant cap on queued + running jobs: 429 problems."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from api.limits.rate_limit import RateLimiter
from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.db.orm import Job
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key, upload


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_the_burst_then_refills_at_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(per_minute=60, burst=3, clock=clock)
    assert [limiter.acquire("k") for _ in range(3)] == [None, None, None]
    wait = limiter.acquire("k")
    assert wait == pytest.approx(1.0)  # one token per second
    clock.now += 0.5
    assert limiter.acquire("k") == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.acquire("k") is None
    assert limiter.acquire("other") is None  # keys are independent


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0, max_value=2.0, allow_nan=False), min_size=1, max_size=200),
    per_minute=st.sampled_from([30.0, 120.0, 600.0]),
    burst=st.integers(min_value=1, max_value=20),
)
def test_never_more_than_burst_plus_rate_times_elapsed(gaps: list[float], per_minute: float, burst: int) -> None:
    clock = FakeClock()
    limiter = RateLimiter(per_minute=per_minute, burst=burst, clock=clock)
    allowed = 0
    for gap in gaps:
        clock.now += gap
        if limiter.acquire("k") is None:
            allowed += 1
        assert allowed <= burst + clock.now * per_minute / 60.0 + 1e-9


def test_key_table_is_bounded() -> None:
    limiter = RateLimiter(per_minute=60, burst=1, clock=FakeClock(), max_keys=10)
    for i in range(100):
        limiter.acquire(f"key{i}")
    assert len(limiter._buckets) == 10


def _client(tmp_path: Path, **overrides: object) -> Iterator[tuple[TestClient, Database]]:
    settings_ = make_settings(tmp_path / "data", max_upload_bytes=5_000_000, **overrides)
    migrate(settings_)
    database = Database(settings_.resolved_database_url)
    with TestClient(create_app(settings_, dispatcher=RecordingDispatcher())) as client:
        yield client, database
    database.dispose()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[tuple[TestClient, Database]]:
    yield from _client(tmp_path, rate_limit_per_minute=60, rate_limit_burst=5)


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[tuple[TestClient, Database]]:
    yield from _client(tmp_path, max_active_jobs_per_tenant=2)


def test_requests_over_the_limit_get_a_429_problem_with_retry_after(limited: tuple[TestClient, Database]) -> None:
    client, database = limited
    alice = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
    bob = {"Authorization": f"Bearer {new_key(database, 'bob')}"}
    statuses = [client.get("/v1/datasets", headers=alice).status_code for _ in range(5)]
    assert statuses == [200] * 5
    limited_response = client.get("/v1/datasets", headers=alice)
    assert limited_response.status_code == 429
    assert limited_response.headers["content-type"].startswith("application/problem+json")
    assert limited_response.json()["type"] == "/problems/rate-limited"
    assert 1 <= int(limited_response.headers["Retry-After"]) <= 2
    assert client.get("/v1/datasets", headers=bob).status_code == 200  # per key, not global
    assert client.get("/healthz").status_code == 200  # probes are never limited
    assert client.get("/readyz", headers=alice).status_code == 200


def test_active_job_cap_is_a_429_and_stores_nothing(capped: tuple[TestClient, Database], digits_csv: bytes) -> None:
    client, database = capped
    client.headers["Authorization"] = f"Bearer {new_key(database, 'carol')}"
    dataset_id = upload(client, digits_csv, epsilon=100).json()["id"]
    spec = dp_sgd_spec(dataset_id, target_epsilon=1.0)
    first, second = (client.post("/v1/jobs", json=spec) for _ in range(2))
    assert first.status_code == second.status_code == 202
    budget_before = client.get(f"/v1/datasets/{dataset_id}/budget").json()
    third = client.post("/v1/jobs", json=spec)
    assert third.status_code == 429, third.text
    assert third.json()["type"] == "/problems/too-many-active-jobs"
    assert third.json()["limit"] == 2 and third.headers["Retry-After"] == "30"
    with database.session() as session:
        assert session.query(Job).count() == 2  # no row for the refused job
    assert client.get(f"/v1/datasets/{dataset_id}/budget").json() == budget_before  # no reservation
    assert client.post(f"/v1/jobs/{first.json()['id']}/cancel").status_code == 202
    assert client.post("/v1/jobs", json=spec).status_code == 202  # a slot is free again


def test_job_time_limit_above_the_service_limit_is_refused(
    capped: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, database = capped
    client.headers["Authorization"] = f"Bearer {new_key(database, 'dave')}"
    dataset_id = upload(client, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset_id)
    spec["training"]["time_limit_s"] = 24 * 3600.0 + 1  # the default service limit is 24 h
    refused = client.post("/v1/jobs", json=spec)
    assert refused.status_code == 422
    assert "time_limit_s" in refused.json()["detail"]
    spec["training"]["time_limit_s"] = 60.0
    accepted = client.post("/v1/jobs", json=spec)
    assert accepted.status_code == 202


def test_redis_mode_refuses_a_time_limit_at_or_above_the_visibility_timeout(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="VISIBILITY_TIMEOUT"):
        make_settings(
            tmp_path, broker_url="redis://127.0.0.1:6379/15", job_time_limit_s=100.0, redis_visibility_timeout_s=100.0
        )
    ok = make_settings(
        tmp_path, broker_url="redis://127.0.0.1:6379/15", job_time_limit_s=99.0, redis_visibility_timeout_s=100.0
    )
    from kernel.queue import create_celery

    assert create_celery(ok).conf.broker_transport_options["visibility_timeout"] == 100.0
    make_settings(tmp_path, job_time_limit_s=100.0, redis_visibility_timeout_s=100.0)  # filesystem: n/a
