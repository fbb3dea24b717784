"""Requests in flight are capped per principal (issue 36, item 4).

Before, one key could hold any number of ordinary requests open at once: the rate limit counts
requests, not concurrency, and 30 concurrent dashboard and API GETs from one key (13 requests/s,
under the limit) pushed ``/healthz`` and another tenant's p99 to seconds. Now a key, a tenant (all
its keys), an address without a valid key, and the process each have a cap; past it the answer is
429 ``too-many-concurrent-requests`` with ``Retry-After`` at once, while everyone else is served.

The flood is held deterministically: a patched lookup inside a real route (``GET /v1/jobs/{id}``,
or the Bearer authentication) blocks until the test opens a gate, so "the N+1-th request while N
are in flight" is exact, with no wall-clock thresholds. Real uvicorn, real threads.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import api.routes.deps as deps_module
import api.routes.jobs as jobs_module
from api.limits.request_slots import RequestSlots
from api.main import create_app
from api.routes.ui_session import COOKIE_NAME
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from tests.concurrency_helpers import digits_csv
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key
from tests.live_app import serving

pytestmark = pytest.mark.timeout(300)

TOO_MANY = "/problems/too-many-concurrent-requests"
HELD_JOB = "job_held_by_the_test"
BAD_KEY_PREFIX = "pt_bad_"
WAIT_S = 60.0
"""Generous: how long a held request may take to reach the gate on a loaded machine."""


# ----------------------------------------------------------------------------------- harness


@dataclass
class Gate:
    """Requests that reach a patched lookup wait here until the test opens the gate."""

    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    opened: threading.Event = field(default_factory=threading.Event)

    def hold(self) -> None:
        self.entered.release()
        assert self.opened.wait(timeout=WAIT_S), "the test never opened the gate"

    def wait_for(self, n: int) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=WAIT_S), "a flood request never reached the route"


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """``GET /v1/jobs/job_held_by_the_test`` and any Bearer key starting ``pt_bad_`` are held in
    the route (the job lookup, the authentication) until the gate opens; they then answer 404 and
    401 as usual. Everything else is untouched."""
    gate = Gate()
    real_job_for, real_tenant_for_key = jobs_module.job_for, deps_module.tenant_for_key

    def job_for(session: Any, tenant: Any, job_id: str, *, need: str) -> Any:
        if job_id == HELD_JOB:
            gate.hold()
        return real_job_for(session, tenant, job_id, need=need)

    def tenant_for_key(session: Any, key: str) -> Any:
        if key.startswith(BAD_KEY_PREFIX):
            gate.hold()  # a slow authentication: the database is busy, say
        return real_tenant_for_key(session, key)

    monkeypatch.setattr(jobs_module, "job_for", job_for)
    monkeypatch.setattr(deps_module, "tenant_for_key", tenant_for_key)
    try:
        yield gate
    finally:
        gate.opened.set()


@dataclass
class Live:
    base_url: str
    app: FastAPI
    db: Database
    pool: ThreadPoolExecutor

    @property
    def slots(self) -> RequestSlots:
        slots: RequestSlots = self.app.state.request_slots
        return slots

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=WAIT_S, follow_redirects=False)

    def get(self, path: str, *, key: str | None = None, **kwargs: Any) -> httpx.Response:
        with self.client(key) as client:
            return client.get(path, **kwargs)

    def in_background(self, request: Callable[[httpx.Client], httpx.Response], *, key: str | None) -> Future[int]:
        """Send one request from a thread of its own; its future is the status code."""

        def send() -> int:
            with self.client(key) as client:
                return request(client).status_code

        return self.pool.submit(send)


@contextmanager
def live(tmp_path: Path, **caps: object) -> Iterator[Live]:
    settings = make_settings(tmp_path / "data", run_reconciler=False, max_upload_bytes=5_000_000, **caps)
    migrate(settings)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    db = Database(settings.resolved_database_url)
    with serving(app) as base_url, ThreadPoolExecutor(max_workers=16) as pool:
        try:
            yield Live(base_url, app, db, pool)
        finally:
            db.dispose()


def hold_job_lookups(live: Live, key: str, n: int, gate: Gate) -> list[Future[int]]:
    """``n`` requests of ``key`` held inside ``GET /v1/jobs/{id}`` until the gate opens."""
    flood = [live.in_background(lambda c: c.get(f"/v1/jobs/{HELD_JOB}"), key=key) for _ in range(n)]
    gate.wait_for(n)
    return flood


def assert_refused(response: httpx.Response, *, scope: str, limit: int) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["Retry-After"] == "1"
    problem = response.json()
    assert (problem["type"], problem["scope"], problem["limit"]) == (TOO_MANY, scope, limit), problem


def dashboard_cookie(live: Live, key: str) -> str:
    with live.client() as browser:
        token = re.search(r'name="csrf_token" value="([^"]+)"', browser.get("/ui/login").text)
        assert token is not None
        response = browser.post("/ui/login", data={"csrf_token": token.group(1), "api_key": key})
        assert response.status_code == 303, response.text
        value = browser.cookies.get(COOKIE_NAME)
        assert value
        return value


# ------------------------------------------------------------------------------------ per key


def test_a_key_past_its_cap_gets_429_while_others_and_the_probes_are_served(tmp_path: Path, gate: Gate) -> None:
    with live(tmp_path, max_concurrent_requests_per_key=3) as service:
        alice, bob = new_key(service.db, "alice"), new_key(service.db, "bob")
        cookie = dashboard_cookie(service, alice)
        flood = hold_job_lookups(service, alice, 3, gate)

        # The flood holds its three slots: alice's fourth request, by Bearer or by her dashboard
        # cookie (the same key), is refused at once; nobody else waits.
        assert_refused(service.get("/v1/datasets", key=alice), scope="per-key", limit=3)
        by_cookie = service.get("/ui/datasets", headers={"Cookie": f"{COOKIE_NAME}={cookie}"})
        assert_refused(by_cookie, scope="per-key", limit=3)
        assert service.get("/v1/datasets", key=bob).status_code == 200
        for probe in ("/healthz", "/readyz", "/metrics"):
            assert service.get(probe).status_code == 200, probe
        assert not any(request.done() for request in flood), "the flood was held the whole time"

        gate.opened.set()
        assert [request.result(timeout=WAIT_S) for request in flood] == [404, 404, 404]
        assert service.get("/v1/datasets", key=alice).status_code == 200  # its slots came back
    assert service.slots.owners() == 0, "every slot was released"


def test_a_tenant_with_many_keys_shares_one_cap(tmp_path: Path, gate: Gate) -> None:
    with live(tmp_path, max_concurrent_requests_per_key=2, max_concurrent_requests_per_tenant=3) as service:
        keys = [new_key(service.db, "alice") for _ in range(3)]
        bob = new_key(service.db, "bob")
        flood = hold_job_lookups(service, keys[0], 2, gate) + hold_job_lookups(service, keys[1], 1, gate)

        assert_refused(service.get("/v1/datasets", key=keys[2]), scope="per-tenant", limit=3)
        assert_refused(service.get("/v1/datasets", key=keys[0]), scope="per-key", limit=2)
        assert service.get("/v1/datasets", key=bob).status_code == 200
        gate.opened.set()
        assert sorted(request.result(timeout=WAIT_S) for request in flood) == [404, 404, 404]
        assert service.get("/v1/datasets", key=keys[2]).status_code == 200
    assert service.slots.owners() == 0


def test_the_process_cap_answers_429_total(tmp_path: Path, gate: Gate) -> None:
    with live(tmp_path, max_concurrent_requests=4) as service:
        alice, bob = new_key(service.db, "alice"), new_key(service.db, "bob")
        flood = hold_job_lookups(service, alice, 4, gate)
        assert_refused(service.get("/v1/datasets", key=bob), scope="total", limit=4)
        assert service.get("/healthz").status_code == 200  # probes are never counted
        gate.opened.set()
        assert [request.result(timeout=WAIT_S) for request in flood] == [404] * 4
    assert service.slots.owners() == 0


# ---------------------------------------------------------------------- requests without a key


def test_a_flood_of_random_keys_cannot_lock_out_a_key_or_its_pricing(tmp_path: Path, gate: Gate) -> None:
    """Random keys, held in authentication from the same address as the key's owner, fill that
    address's share; the owner (never seen before by the cap) is still counted as itself. And an
    unknown key takes no pricing slot, so the flood cannot hold the process's only one."""
    with live(
        tmp_path, max_concurrent_requests_per_address=2, max_concurrent_unverified_requests=4, max_concurrent_plans=1
    ) as service:
        alice = new_key(service.db, "alice")
        with service.client(alice) as client:
            dataset = client.post(
                "/v1/datasets",
                content=digits_csv(),
                params={"name": "d", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
            )
        assert dataset.status_code == 201, dataset.text
        spec = dp_sgd_spec(dataset.json()["id"], noise_multiplier=2.0)

        def bad_estimate(client: httpx.Client) -> httpx.Response:
            return client.post("/v1/jobs/estimate", json=spec)

        flood = [
            service.in_background(bad_estimate, key=f"{BAD_KEY_PREFIX}{secrets.token_urlsafe(16)}") for _ in range(2)
        ]
        gate.wait_for(2)

        assert_refused(service.get("/v1/datasets", key=f"{BAD_KEY_PREFIX}more"), scope="per-address", limit=2)
        assert_refused(service.get("/ui/login"), scope="per-address", limit=2)  # anonymous: the same share
        with service.client(alice) as client:
            assert client.get("/v1/datasets").status_code == 200
            estimate = client.post("/v1/jobs/estimate", json=spec)
        assert estimate.status_code == 200, estimate.text
        gate.opened.set()
        assert [request.result(timeout=WAIT_S) for request in flood] == [401, 401]
    assert service.slots.owners() == 0


# ------------------------------------------------------------------------- answers and streams


def test_a_sequential_client_never_meets_its_own_previous_request(tmp_path: Path) -> None:
    """With a cap of one, each slot must be free before the client can read the answer."""
    with live(tmp_path, max_concurrent_requests_per_key=1) as service:
        alice = new_key(service.db, "alice")
        with service.client(alice) as client:
            statuses = [client.get(path).status_code for _ in range(20) for path in ("/v1/datasets", "/v1/jobs")]
    assert statuses == [200] * 40


def test_an_open_event_stream_holds_no_request_slot(tmp_path: Path) -> None:
    with live(tmp_path, max_concurrent_requests_per_key=1, sse_keepalive_s=0.2) as service:
        alice = new_key(service.db, "alice")
        with service.client(alice) as client:
            dataset = client.post(
                "/v1/datasets",
                content=digits_csv(),
                params={"name": "d", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
            )
            job = client.post("/v1/jobs", json=dp_sgd_spec(dataset.json()["id"], noise_multiplier=2.0))
        assert job.status_code == 202, job.text
        with (
            service.client(alice) as streaming,
            streaming.stream(
                "GET", f"/v1/jobs/{job.json()['id']}/events", headers={"Accept": "text/event-stream"}
            ) as s,
        ):
            assert s.status_code == 200
            lines = s.iter_lines()  # kept: a dropped iterator closes the connection, and so the stream
            assert next(lines).startswith("retry:")  # the stream is being served
            assert service.get("/v1/datasets", key=alice).status_code == 200  # the only request slot is free
            assert next(lines) is not None, "the stream was open the whole time"
    assert service.slots.owners() == 0


# ---------------------------------------------------------------------------------- the probes


def test_probes_never_wait_for_the_shared_thread_pool(tmp_path: Path, gate: Gate) -> None:
    """With every thread of the pool that sync routes share taken by one tenant's requests,
    ``/healthz``, ``/readyz`` and ``/metrics`` still answer (they use threads of their own)."""
    settings = make_settings(tmp_path / "data", run_reconciler=False)
    migrate(settings)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    with TestClient(app) as client, ThreadPoolExecutor(max_workers=4) as pool:
        key = new_key(app.state.services.db, "alice")

        def shrink() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 3

        client.portal.call(shrink)  # type: ignore[union-attr]  # set by TestClient.__enter__
        flood = [
            pool.submit(lambda: client.get(f"/v1/jobs/{HELD_JOB}", headers={"Authorization": f"Bearer {key}"}))
            for _ in range(3)
        ]
        gate.wait_for(3)  # all three shared threads are held
        try:
            for probe in ("/healthz", "/readyz", "/metrics"):
                answer = pool.submit(client.get, probe)
                assert answer.result(timeout=WAIT_S).status_code == 200, probe
        finally:
            gate.opened.set()
        assert [request.result(timeout=WAIT_S).status_code for request in flood] == [404] * 3
