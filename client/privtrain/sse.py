"""A Server-Sent-Events progress source: the job's events pushed by the server as they land.

Same signature as :func:`privtrain.events.poll_progress`, so ``Client.wait`` and
``privtrain jobs watch --sse`` take either. One GET of the job at the start and one at the end;
in between the snapshot is advanced by the events themselves (a registry of event kind →
update). A stream the server ends early (its maximum stream life) is resumed with
``Last-Event-ID``: no gaps, no repeats.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from privtrain.progress import JobProgress
from privtrain.resources import TERMINAL_STATUSES, Job, JobEvent

if TYPE_CHECKING:
    from privtrain.client import Client


@dataclass(frozen=True)
class SseMessage:
    id: str | None
    event: str
    data: str


def parse_sse(lines: Iterable[str]) -> Iterator[SseMessage]:
    """The WHATWG event-stream format: ``field: value`` lines, a blank line ends a message,
    ``:`` starts a comment (keep-alives), several ``data`` lines are joined with newlines."""
    event = "message"
    data: list[str] = []
    last_id: str | None = None
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield SseMessage(id=last_id, event=event, data="\n".join(data))
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            last_id = value
        # "retry" and unknown fields are ignored: the client decides its own reconnect policy


def _epsilon(event: JobEvent, current: float | None) -> float | None:
    value = event.payload.get("epsilon_spent")
    return float(value) if value is not None else current


def _unchanged(job: Job, payload: dict[str, Any]) -> Job:
    return job


def _running(job: Job, payload: dict[str, Any]) -> Job:
    return dataclasses.replace(job, status="running")


def _progress(job: Job, payload: dict[str, Any]) -> Job:
    return dataclasses.replace(job, status="running", steps_run=int(payload.get("step", job.steps_run)))


def _queued(job: Job, payload: dict[str, Any]) -> Job:
    return dataclasses.replace(job, status="queued")


def _cancel_requested(job: Job, payload: dict[str, Any]) -> Job:
    return dataclasses.replace(job, cancel_requested=True)


# How each non-terminal event kind moves the local snapshot; unknown kinds leave it unchanged.
EVENT_UPDATES: dict[str, Callable[[Job, dict[str, Any]], Job]] = {
    "queued": _queued,
    "requeued": _queued,
    "started": _running,
    "progress": _progress,
    "cancel-requested": _cancel_requested,
}


def sse_progress(client: Client, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]:
    """Snapshots from the event stream; ``poll_interval`` is only the pause before a reconnect."""
    job = client.get_job(job_id)
    epsilon_spent: float | None = None
    after = 0
    while True:
        yield JobProgress(job=job, epsilon_spent=epsilon_spent)
        if job.is_terminal:
            return
        with closing(client.stream_events(job_id, after=after)) as stream:
            for event in stream:
                after = event.seq
                epsilon_spent = _epsilon(event, epsilon_spent)
                if event.kind in TERMINAL_STATUSES:
                    break
                job = EVENT_UPDATES.get(event.kind, _unchanged)(job, event.payload)
                yield JobProgress(job=job, epsilon_spent=epsilon_spent)
            else:
                client.sleep(poll_interval)  # the stream ended early: resume after `after`
        job = client.get_job(job_id)  # terminal, or after a reconnect pause: the full object
        if job.is_terminal:  # it may have ended while no stream was open: its last events
            for event in client.events(job_id, after=after):
                epsilon_spent = _epsilon(event, epsilon_spent)


ACCESS_REVOKED = "access-revoked"
"""The server's last message on a stream whose reader lost access; it carries no job data."""


def events_from_stream(lines: Iterable[str]) -> Iterator[JobEvent]:
    """Job events from an event-stream body (each ``data`` is one JobEventOut as JSON).

    ``access-revoked`` (the key was revoked or the job may no longer be read) ends the body; the
    caller's reconnect then meets the server's 401/404 and raises it as a proper error.
    """
    for message in parse_sse(lines):
        if message.event == ACCESS_REVOKED:
            return
        yield JobEvent.from_api(json.loads(message.data))
