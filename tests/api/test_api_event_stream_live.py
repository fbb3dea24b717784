"""Event streams against a real uvicorn server: open streams hold no request thread (sync routes
stay fast with 60 of them open), the per-key and total caps (429 before the stream starts), slots
released when a client goes away, and streams that end at the first poll after access is lost
(key revoked, dashboard logged out, grant withdrawn under a rule that drops the reader).

Why real HTTP: the TestClient buffers a whole response, so neither a client disconnect nor the
threads a stream holds can be seen through it.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import select, update

from api.main import create_app
from api.routes.stream_access import api_reader
from api.routes.stream_slots import stream_slots_of
from api.routes.ui_session import COOKIE_NAME
from kernel.access import roles as access
from kernel.access.keys import find_api_keys, key_digest, revoke_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import DatasetGrant, Job, Tenant, utcnow
from kernel.errors import DomainError
from tests.concurrency_helpers import digits_csv, free_port
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key

pytestmark = pytest.mark.timeout(300)

SSE = {"Accept": "text/event-stream"}
OPEN_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 20.0
"""Generous bounds for a loaded 2-core machine: how long a stream may take to open, and how long
the server may take to notice a disconnect or a lost access (polls run every 0.05 s here)."""


@dataclass
class Served:
    base_url: str
    port: int
    app: FastAPI
    settings: Settings
    db: Database

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=OPEN_TIMEOUT_S, follow_redirects=False)

    def in_flight(self, key: str | None = None) -> int:
        slots = stream_slots_of(self.app, self.settings)
        return slots.in_flight(key_digest(key) if key is not None else None)


@contextmanager
def served(settings: Settings) -> Iterator[Served]:
    """The app behind uvicorn on a free port (a thread of this process, so tests can look at its state)."""
    migrate(settings)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", timeout_graceful_shutdown=5
        )
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    db = Database(settings.resolved_database_url)
    try:
        yield Served(f"http://127.0.0.1:{port}", port, app, settings, db)
    finally:
        db.dispose()
        server.should_exit = True
        thread.join(timeout=30)


def stream_settings(data_dir: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "run_reconciler": False,
        "sse_poll_interval_s": 0.05,
        "sse_keepalive_s": 0.5,
        "sse_max_stream_s": 60.0,
        "max_upload_bytes": 5_000_000,
    }
    values.update(overrides)
    return make_settings(data_dir, **values)


def queued_job(live: Served, key: str) -> str:
    with live.client(key) as client:
        dataset = client.post(
            "/v1/datasets",
            content=digits_csv(),
            params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
        )
        assert dataset.status_code == 201, dataset.text
        job = client.post("/v1/jobs", json=dp_sgd_spec(dataset.json()["id"]))
        assert job.status_code == 202, job.text
        return str(job.json()["id"])


class RawStream:
    """An event stream held open on a bare socket: nothing reads it until it is closed, as a
    slow or idle client would (the server's few keep-alive bytes fit in the socket buffers)."""

    def __init__(self, live: Served, path: str, headers: dict[str, str]) -> None:
        self.sock = socket.create_connection(("127.0.0.1", live.port), timeout=OPEN_TIMEOUT_S)
        lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{live.port}", *(f"{k}: {v}" for k, v in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            assert chunk, "the server closed the connection before answering"
            head += chunk
        self.status = int(head.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()


def open_streams(live: Served, job_id: str, key: str, n: int) -> list[RawStream]:
    streams = [
        RawStream(live, f"/v1/jobs/{job_id}/events", {"Authorization": f"Bearer {key}", **SSE}) for _ in range(n)
    ]
    assert [s.status for s in streams] == [200] * n
    return streams


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def messages_of(lines: Iterator[str]) -> list[dict]:
    """The rest of an SSE body as messages (event, id, data), read until the server closes it."""
    messages, fields = [], {}
    for line in lines:
        if not line:
            if fields:
                messages.append(fields)
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            fields[name] = json.loads(value) if name == "data" else value
    return messages


def revoke(live: Served, key: str) -> None:
    with live.db.write_transaction() as tx:
        (api_key,) = find_api_keys(tx, key)
        assert revoke_api_key(tx, api_key)


def dashboard_cookie(live: Served, key: str) -> str:
    with live.client() as browser:
        form = browser.get("/ui/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert token is not None
        response = browser.post("/ui/login", data={"csrf_token": token.group(1), "api_key": key})
        assert response.status_code == 303, response.text
        value = browser.cookies.get(COOKIE_NAME)
        assert value
        return value


# ------------------------------------------------------------------------------------ the DoS


def test_sixty_open_streams_leave_sync_routes_fast(tmp_path: Path) -> None:
    """The finding: each stream slept inside Starlette's shared 40-thread pool for up to the
    keep-alive interval (15 s) per chunk, so 45 streams made every sync route wait 13–15 s.
    Default timing here (keep-alives every 15 s); only the caps are raised to let 60 streams in."""
    settings = stream_settings(
        tmp_path / "data",
        sse_poll_interval_s=0.5,
        sse_keepalive_s=15.0,
        sse_max_stream_s=300.0,
        sse_max_streams_per_key=64,
        sse_max_streams_total=128,
    )
    with served(settings) as live:
        alice, bob = new_key(live.db, "alice"), new_key(live.db, "bob")
        job_id = queued_job(live, alice)
        streams = open_streams(live, job_id, alice, 60)
        try:
            assert live.in_flight(alice) == 60
            time.sleep(1.0)  # every stream is past its first poll and waiting
            with live.client() as anonymous, live.client(bob) as other_tenant:
                for _ in range(3):
                    for client, path in ((anonymous, "/healthz"), (other_tenant, "/v1/datasets")):
                        started = time.monotonic()
                        response = client.get(path)
                        elapsed = time.monotonic() - started
                        assert response.status_code == 200, (path, response.text)
                        assert elapsed < 1.0, f"{path} took {elapsed:.2f} s with 60 streams open"
            assert live.in_flight(alice) == 60, "the streams were open the whole time"
        finally:
            for stream in streams:
                stream.close()
        wait_until(lambda: live.in_flight() == 0, "every slot to be released after the clients left")


# ------------------------------------------------------------------------------------ the caps


def test_streams_past_the_per_key_or_total_cap_get_a_429_before_starting(tmp_path: Path) -> None:
    settings = stream_settings(tmp_path / "data", sse_max_streams_per_key=3, sse_max_streams_total=5)
    with served(settings) as live:
        alice, bob = new_key(live.db, "alice"), new_key(live.db, "bob")
        alice_job, bob_job = queued_job(live, alice), queued_job(live, bob)
        held = open_streams(live, alice_job, alice, 3)
        try:
            with live.client(alice) as client:
                refused = client.get(f"/v1/jobs/{alice_job}/events", headers=SSE)
            assert refused.status_code == 429
            assert refused.headers["content-type"].startswith("application/problem+json")
            assert refused.headers["Retry-After"] == "5"
            problem = refused.json()
            assert problem["type"] == "/problems/too-many-streams" and problem["scope"] == "per-key"
            assert problem["limit"] == 3 and "data:" not in refused.text
            cookie = dashboard_cookie(live, alice)  # the dashboard's streams count against the same key
            with live.client() as browser:
                ui = browser.get(f"/ui/jobs/{alice_job}/events", headers={"Cookie": f"{COOKIE_NAME}={cookie}"})
            assert ui.status_code == 429 and ui.json()["scope"] == "per-key"
            held += open_streams(live, bob_job, bob, 2)  # another key still may: 5 open in total
            with live.client(bob) as client:
                total = client.get(f"/v1/jobs/{bob_job}/events", headers=SSE)
            assert total.status_code == 429 and total.json()["scope"] == "total" and total.json()["limit"] == 5
            assert live.in_flight() == 5 and live.in_flight(alice) == 3
            held.pop(0).close()  # one client goes away: its slot comes back
            wait_until(lambda: live.in_flight(alice) == 2, "the closed stream's slot")
            held += open_streams(live, bob_job, bob, 1)
        finally:
            for stream in held:
                stream.close()
        wait_until(lambda: live.in_flight() == 0, "every slot to be released")


# ------------------------------------------------------------------------------- lost access


def test_revoking_the_key_ends_its_open_stream_without_more_job_data(tmp_path: Path) -> None:
    """The finding: a revoked key kept receiving events for the stream's whole life."""
    with served(stream_settings(tmp_path / "data")) as live:
        streaming, other = new_key(live.db, "alice"), new_key(live.db, "alice")
        job_id = queued_job(live, other)
        with live.client(streaming) as client, client.stream("GET", f"/v1/jobs/{job_id}/events", headers=SSE) as body:
            assert body.status_code == 200
            lines = body.iter_lines()
            assert next(lines).startswith("retry: ")
            assert live.in_flight(streaming) == 1
            started = time.monotonic()
            revoke(live, streaming)
            with live.client(other) as owner:  # new events after the revocation must not reach it
                assert owner.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
            after_revocation = messages_of(lines)
            elapsed = time.monotonic() - started
        events = [m["event"] for m in after_revocation]
        assert events[-1] == "access-revoked" and after_revocation[-1]["data"] == {}
        assert "id" not in after_revocation[-1]
        assert "cancelled" not in events, "no job data after the key was revoked"
        assert elapsed < SETTLE_TIMEOUT_S < live.settings.sse_max_stream_s, "ended by the revocation, not its life"
        wait_until(lambda: live.in_flight() == 0, "the revoked stream's slot")
        with live.client(streaming) as client:
            assert client.get(f"/v1/jobs/{job_id}/events", headers=SSE).status_code == 401


@pytest.mark.parametrize("ending", ["logout", "key revoked"])
def test_ending_the_dashboard_session_ends_its_open_stream(tmp_path: Path, ending: str) -> None:
    with served(stream_settings(tmp_path / "data")) as live:
        alice = new_key(live.db, "alice")
        job_id = queued_job(live, alice)
        cookie = {"Cookie": f"{COOKIE_NAME}={dashboard_cookie(live, alice)}"}
        with live.client() as browser, browser.stream("GET", f"/ui/jobs/{job_id}/events", headers=cookie) as body:
            assert body.status_code == 200
            lines = body.iter_lines()
            assert next(lines).startswith("retry: ")
            started = time.monotonic()
            if ending == "logout":
                with live.client() as same_browser:
                    page = same_browser.get("/ui/datasets", headers=cookie)
                    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
                    assert token is not None
                    out = same_browser.post("/ui/logout", data={"csrf_token": token.group(1)}, headers=cookie)
                    assert out.status_code == 303
            else:
                revoke(live, alice)
            after = messages_of(lines)
            elapsed = time.monotonic() - started
        assert after[-1]["event"] == "access-revoked" and after[-1]["data"] == {}
        assert elapsed < SETTLE_TIMEOUT_S < live.settings.sse_max_stream_s
        wait_until(lambda: live.in_flight() == 0, "the dashboard stream's slot")
        with live.client() as browser:
            assert browser.get(f"/ui/jobs/{job_id}/events", headers=cookie).status_code == 401


# --------------------------------------------------------------------------- grant withdrawal


@dataclass
class GrantWorld:
    live: Served
    alice: str
    bob: str
    job_id: str
    dataset_id: str


@pytest.fixture
def grant_world(tmp_path: Path) -> Iterator[GrantWorld]:
    """Alice's dataset, an accepted grant to bob, and a queued job bob submitted on it."""
    with served(stream_settings(tmp_path / "data")) as live:
        alice, bob = new_key(live.db, "alice"), new_key(live.db, "bob")
        alice_job = queued_job(live, alice)
        with live.db.write_transaction() as tx:
            tenants = dict(tx.execute(select(Tenant.name, Tenant.id)).all())
            dataset_id = tx.scalar(select(Job.dataset_id).where(Job.id == alice_job))
            tx.add(
                DatasetGrant(
                    dataset_id=dataset_id,
                    grantee_name="bob",
                    grantee_tenant_id=tenants["bob"],
                    granted_by=tenants["alice"],
                    accepted_at=utcnow(),
                )
            )
        with live.client(bob) as client:
            job = client.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0))
            assert job.status_code == 202, job.text
        yield GrantWorld(live, alice, bob, job.json()["id"], dataset_id)


def withdraw(world: GrantWorld) -> None:
    with world.live.db.write_transaction() as tx:
        tx.execute(update(DatasetGrant).where(DatasetGrant.dataset_id == world.dataset_id).values(revoked_at=utcnow()))


def test_stream_access_follows_the_grant_rules_after_a_withdrawal(grant_world: GrantWorld) -> None:
    """The per-poll check is kernel.access.roles.job_for itself: after the withdrawal it answers exactly
    as the job route does, whatever the grant rules say about a former analyst."""
    live = grant_world.live
    reader = api_reader(key_digest=key_digest(grant_world.bob), job_id=grant_world.job_id)
    stranger = api_reader(key_digest=key_digest(new_key(live.db, "carol")), job_id=grant_world.job_id)
    with live.db.read_session() as session:
        assert reader(session) and not stranger(session)
    withdraw(grant_world)
    with live.client(grant_world.bob) as client:
        route_allows = client.get(f"/v1/jobs/{grant_world.job_id}").status_code == 200
    with live.db.read_session() as session:
        assert reader(session) == route_allows
        bob = session.scalar(select(Tenant).where(Tenant.name == "bob"))
        try:
            access.job_for(session, bob, grant_world.job_id, need="read")
            job_for_allows = True
        except DomainError:
            job_for_allows = False
        assert reader(session) == job_for_allows


def test_withdrawing_the_grant_ends_the_stream_when_the_rules_drop_the_reader(
    grant_world: GrantWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a rule under which a former analyst may not read its jobs, withdrawing the grant
    ends bob's open stream at the next poll: the stream calls the rules, it does not copy them."""
    monkeypatch.setitem(access.JOB_PERMISSIONS, "read", frozenset({"dataset-owner", "submitter"}))
    live = grant_world.live
    with (
        live.client(grant_world.bob) as client,
        client.stream("GET", f"/v1/jobs/{grant_world.job_id}/events", headers=SSE) as body,
    ):
        assert body.status_code == 200
        lines = body.iter_lines()
        assert next(lines).startswith("retry: ")
        started = time.monotonic()
        withdraw(grant_world)
        after = messages_of(lines)
        elapsed = time.monotonic() - started
    assert [m["event"] for m in after if m.get("event") == "access-revoked"] == ["access-revoked"]
    assert after[-1]["event"] == "access-revoked"
    assert elapsed < SETTLE_TIMEOUT_S < live.settings.sse_max_stream_s
    wait_until(lambda: live.in_flight() == 0, "the stream's slot")
