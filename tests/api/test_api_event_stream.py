"""GET /v1/jobs/{id}/events as Server-Sent Events: same payloads, resumable, keep-alives, bounded."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routes.event_stream import AccessCheck, StreamTiming, job_event_stream, resume_point, wants_event_stream
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key, upload
from tests.event_seq_race import race_event_writers

SSE = {"Accept": "text/event-stream"}


@pytest.fixture
def sse_client(tmp_path: Path) -> Iterator[tuple[TestClient, Database]]:
    settings = make_settings(tmp_path / "data", sse_poll_interval_s=0.02, sse_keepalive_s=0.05, sse_max_stream_s=0.4)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    with TestClient(app) as client:
        client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
        yield client, database
    database.dispose()


def _parse(body: str) -> tuple[list[dict], list[str]]:
    """(messages with id/event/data, comment lines) of an SSE body."""
    messages, comments = [], []
    for block in body.split("\n\n"):
        fields: dict = {}
        for line in block.splitlines():
            if line.startswith(":"):
                comments.append(line)
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "data" in fields:
            fields["data"] = json.loads(fields["data"])
            messages.append(fields)
    return messages, comments


def _queued_job(client: TestClient, digits_csv: bytes) -> str:
    dataset_id = upload(client, digits_csv).json()["id"]
    response = client.post("/v1/jobs", json=dp_sgd_spec(dataset_id))
    assert response.status_code == 202, response.text
    return response.json()["id"]


def test_stream_carries_the_json_events_then_keepalives_and_ends(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, _ = sse_client
    job_id = _queued_job(client, digits_csv)
    listed = client.get(f"/v1/jobs/{job_id}/events").json()
    assert listed, "a submitted job has at least its admission event"
    started = time.monotonic()
    response = client.get(f"/v1/jobs/{job_id}/events", headers=SSE)
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.text.startswith("retry: ")
    messages, comments = _parse(response.text)
    assert [m["data"] for m in messages] == listed  # the same payloads as the JSON list
    assert [int(m["id"]) for m in messages] == [e["seq"] for e in listed]
    assert [m["event"] for m in messages] == [e["kind"] for e in listed]
    assert ": keep-alive" in comments  # the job stays queued: the stream idles with keep-alives
    assert 0.3 < elapsed < 5  # ... and is closed by sse_max_stream_s, not left open


def test_last_event_id_resumes_without_gaps_or_repeats(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, _ = sse_client
    job_id = _queued_job(client, digits_csv)
    client.post(f"/v1/jobs/{job_id}/cancel")  # terminal: more events, and the stream ends at once
    listed = client.get(f"/v1/jobs/{job_id}/events").json()
    assert len(listed) >= 2
    first = listed[0]["seq"]
    response = client.get(f"/v1/jobs/{job_id}/events", headers={**SSE, "Last-Event-ID": str(first)})
    messages, comments = _parse(response.text)
    assert [int(m["id"]) for m in messages] == [e["seq"] for e in listed[1:]]
    assert messages[-1]["event"] == listed[-1]["kind"]
    assert comments == []  # a terminal job's stream ends as soon as everything is sent
    garbage = client.get(f"/v1/jobs/{job_id}/events", headers={**SSE, "Last-Event-ID": "x-1"})
    assert len(_parse(garbage.text)[0]) == len(listed)  # an unusable id means from the start


def test_stream_of_an_unknown_or_foreign_job_is_a_404_problem(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, database = sse_client
    job_id = _queued_job(client, digits_csv)
    missing = client.get("/v1/jobs/job_missing/events", headers=SSE)
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("application/problem+json")
    foreign = client.get(
        f"/v1/jobs/{job_id}/events", headers={**SSE, "Authorization": f"Bearer {new_key(database, 'bob')}"}
    )
    assert foreign.status_code == 404
    assert foreign.headers["content-type"].startswith("application/problem+json")
    assert "data:" not in foreign.text and "seq" not in foreign.text  # nothing of the job leaks


def test_accept_header_parsing() -> None:
    assert wants_event_stream("text/event-stream")
    assert wants_event_stream("application/json;q=0.5, text/event-stream;q=1")
    assert wants_event_stream("TEXT/EVENT-STREAM")
    assert not wants_event_stream(None)
    assert not wants_event_stream("application/json")
    assert not wants_event_stream("text/event-streamx")


def _drive(
    database: Database,
    job_id: str,
    *,
    after: int,
    on_sleep: Callable[[int], None],
    still_allowed: AccessCheck = lambda _session: True,
) -> tuple[str, list[float]]:
    """Run the async generator to its end on a fake clock; ``on_sleep(n)`` runs at the n-th sleep."""
    now = [0.0]
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        on_sleep(len(sleeps))

    async def collect() -> str:
        stream = job_event_stream(
            db=database,
            job_id=job_id,
            after=after,
            timing=StreamTiming(poll_interval_s=1.0, keepalive_s=100.0, max_stream_s=1000.0),
            still_allowed=still_allowed,
            limiter=anyio.CapacityLimiter(1),
            clock=lambda: now[0],
            sleep=fake_sleep,
        )
        return "".join([chunk async for chunk in stream])  # ends by itself

    return anyio.run(collect), sleeps


def test_resume_point_is_the_later_of_after_and_last_event_id() -> None:
    assert resume_point(0, None) == 0
    assert resume_point(3, "5") == 5 and resume_point(7, "5") == 7
    assert resume_point(2, "x-1") == 2 and resume_point(2, "-4") == 2  # unusable: from `after`
    assert resume_point(0, " 9 ") == 9
    assert resume_point(0, str(2**70)) == 2**62


def test_stream_picks_up_events_written_while_it_runs(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    """Drive the generator with a fake clock: an event written between polls is delivered."""
    client, database = sse_client
    job_id = _queued_job(client, digits_csv)
    listed = client.get(f"/v1/jobs/{job_id}/events").json()

    def cancel_at_second_sleep(n: int) -> None:
        if n == 2:
            client.post(f"/v1/jobs/{job_id}/cancel")  # lands between two polls

    body, sleeps = _drive(database, job_id, after=listed[-1]["seq"], on_sleep=cancel_at_second_sleep)
    messages, _ = _parse(body)
    assert messages and all(int(m["id"]) > listed[-1]["seq"] for m in messages)
    assert messages[-1]["data"]["kind"] == messages[-1]["event"]
    assert len(sleeps) == 2


def test_stream_ends_with_access_revoked_and_no_job_data_once_access_is_lost(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, database = sse_client
    job_id = _queued_job(client, digits_csv)
    allowed = [True]
    checks: list[bool] = []

    def still_allowed(_session: object) -> bool:
        checks.append(allowed[0])
        return allowed[0]

    def revoke_at_third_sleep(n: int) -> None:
        if n == 3:
            allowed[0] = False
            client.post(f"/v1/jobs/{job_id}/cancel")  # new events exist, but must not be sent

    body, sleeps = _drive(database, job_id, after=0, on_sleep=revoke_at_third_sleep, still_allowed=still_allowed)
    assert checks == [True, True, True, False], "access is checked at every poll"
    assert len(sleeps) == 3
    assert body.endswith("event: access-revoked\ndata: {}\n\n")
    messages, _ = _parse(body)
    kinds = [m["event"] for m in messages]
    assert kinds[-1] == "access-revoked" and messages[-1]["data"] == {} and "id" not in messages[-1]
    assert "cancel-requested" not in kinds and "cancelled" not in kinds


def test_each_jobs_events_are_numbered_from_one_without_gaps(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    """Per-job seq: a job's numbers say nothing about other tenants' jobs (the global row id did)."""
    client, _ = sse_client
    first = _queued_job(client, digits_csv)
    dataset_id = client.get(f"/v1/jobs/{first}").json()["dataset_id"]
    second = client.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()["id"]
    client.post(f"/v1/jobs/{first}/cancel")
    for job_id in (first, second):
        listed = client.get(f"/v1/jobs/{job_id}/events").json()
        assert [e["seq"] for e in listed] == list(range(1, len(listed) + 1))
        streamed, _ = _parse(client.get(f"/v1/jobs/{job_id}/events", headers=SSE).text)
        assert [int(m["id"]) for m in streamed] == [e["seq"] for e in listed]
    assert len(client.get(f"/v1/jobs/{first}/events").json()) > len(client.get(f"/v1/jobs/{second}/events").json())
    page = client.get(f"/v1/jobs/{first}/events", params={"after": 1, "limit": 1}).json()
    assert [e["seq"] for e in page] == [2]


def test_concurrent_writers_never_number_two_events_alike_on_sqlite(
    sse_client: tuple[TestClient, Database], digits_csv: bytes
) -> None:
    client, database = sse_client
    job_id = _queued_job(client, digits_csv)
    race_event_writers(database, job_id, cancel=lambda: client.post(f"/v1/jobs/{job_id}/cancel").status_code)
