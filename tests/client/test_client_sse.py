"""The Server-Sent-Events progress source: the parser, a job followed to its end through the
real stream, a stream cut short and resumed with Last-Event-ID, and the progress bar's output."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from privtrain import Client
from privtrain.progress import JobProgress, ProgressBar
from privtrain.resources import Dataset, Job
from privtrain.sse import events_from_stream, parse_sse, sse_progress
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, tiny_spec, wrap


def test_the_parser_follows_the_event_stream_format() -> None:
    body = (
        "retry: 2000\n\n"
        ": keep-alive\n\n"
        'id: 3\nevent: progress\ndata: {"a":\n'
        "data: 1}\n\n"
        "id: 4\r\nevent: succeeded\r\ndata:{}\r\n\r\n"
        "data: no-id-or-event\n\n"
        "id: 9\nevent: cut\ndata: unfinished"  # no blank line: never dispatched
    )
    messages = list(parse_sse(body.splitlines(keepends=True)))
    assert [(m.id, m.event, m.data) for m in messages] == [
        ("3", "progress", '{"a":\n1}'),
        ("4", "succeeded", "{}"),
        ("4", "message", "no-id-or-event"),
    ]


def test_access_revoked_ends_the_events_without_a_job_event() -> None:
    event = {"seq": 1, "kind": "progress", "payload": {"step": 3}, "created_at": "2026-11-24T00:00:00Z"}
    body = [
        "id: 1",
        "event: progress",
        f"data: {json.dumps(event)}",
        "",
        "event: access-revoked",
        "data: {}",
        "",
        "id: 2",
        "event: progress",
        f"data: {json.dumps(event)}",
        "",
    ]
    assert [e.kind for e in events_from_stream(body)] == ["progress"]


@pytest.fixture
def dataset(client: Client, digits_csv: bytes) -> Dataset:
    return client.upload_dataset(digits_csv, name="digits", format="csv", epsilon=8, delta=1e-5)


def test_wait_with_the_event_stream(client: Client, dataset: Dataset, dispatcher: WorkerThreads) -> None:
    dispatcher.run = True
    job = client.submit(tiny_spec(dataset.id))
    snapshots = list(sse_progress(client, job.id, poll_interval=0.01))
    assert [s.job.status for s in snapshots][-1] == "succeeded", dispatcher.outcomes
    steps = [s.steps_done for s in snapshots]
    assert steps == sorted(steps) and steps[-1] == 4
    assert snapshots[-1].epsilon_spent == pytest.approx(client.get_report(job.id)["epsilon"]["ledger"])
    assert "running" in {s.job.status for s in snapshots}  # advanced by the started/progress events
    events = client.list_events(job.id)
    assert [e.kind for e in client.stream_events(job.id, after=events[1].seq)] == [e.kind for e in events[2:]]


def test_a_stream_cut_short_is_resumed_after_the_last_event(
    client: Client, dataset: Dataset, dispatcher: WorkerThreads, transport: AppTransport, api_key: str
) -> None:
    dispatcher.run = True
    job = client.wait(client.submit(tiny_spec(dataset.id)).id, timeout=60, poll_interval=0.05, progress=False)
    streams: list[httpx.Request] = []

    def cut_first_stream(request: httpx.Request, inner: httpx.BaseTransport) -> httpx.Response:
        response = inner.handle_request(request)
        if request.headers.get("accept") != "text/event-stream":
            return response
        streams.append(request)
        messages = response.read().decode().split("\n\n")
        if len(streams) == 1:  # the server's maximum stream life: only the first two events
            messages = messages[:3] + [""]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content="\n\n".join(messages))

    # the job as it was before it ran (at the start and at the reconnect), so the source has to
    # follow the stream, then resume it, to reach the end
    queued = Job.from_api(job.raw | {"status": "queued", "steps_run": 0})

    class Replayed(Client):
        reads = 0

        def get_job(self, job_id: str) -> Job:
            Replayed.reads += 1
            return queued if Replayed.reads <= 2 else super().get_job(job_id)

    with Replayed(BASE_URL, api_key, transport=wrap(transport, cut_first_stream), sleep=lambda _s: None) as cut:
        snapshots = list(sse_progress(cut, job.id, poll_interval=0.01))
    events = client.list_events(job.id)
    assert len(streams) == 2
    assert streams[1].headers["Last-Event-ID"] == str(events[1].seq)
    assert snapshots[-1].job.status == "succeeded" and snapshots[-1].steps_done == 4
    assert snapshots[-1].epsilon_spent == pytest.approx(job.epsilon_reserved)


def _snapshot(status: str, steps: int) -> JobProgress:
    job = Job.from_api(
        {"id": "job_x", "status": status, "steps_run": steps, "steps_planned": 100, "epsilon_ledger": 2.0}
    )
    return JobProgress(job=job, epsilon_spent=steps / 50)


def test_the_bar_writes_a_line_per_tenth_and_per_status_when_not_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar(out)
    for snapshot in [
        _snapshot("queued", 0),
        *(_snapshot("running", s) for s in range(0, 101, 2)),
        _snapshot("succeeded", 100),
    ]:
        bar.update(snapshot)
    lines = out.getvalue().splitlines()
    assert len(lines) == 13  # queued, running at 0, 10 … 100 %, succeeded
    assert lines[0] == "job_x [------------------------------] 0/100 steps  ε spent 0 of 2  queued"
    assert lines[6] == "job_x [###############---------------] 50/100 steps  ε spent 1 of 2  running"
    assert lines[-1].endswith("100/100 steps  ε spent 2 of 2  succeeded")


def test_the_bar_redraws_one_line_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = ProgressBar(out)
    for steps in (1, 2, 3):
        bar.update(_snapshot("running", steps))
    bar.close()
    assert out.getvalue().count("\r") == 3 and out.getvalue().endswith("\n")
    assert json.dumps(out.getvalue()).count("\\n") == 1
