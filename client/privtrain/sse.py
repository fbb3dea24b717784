"""A Server-Sent-Events progress source: the job's events pushed by the server as they land.

Same signature as :func:`privtrain.events.poll_progress`, so ``Client.wait`` and
``privtrain jobs watch --sse`` take either. One GET of the job at the start and one at the end;
in between the snapshot is advanced by the events themselves (a registry of event kind →
update). A stream the server ends early (its maximum stream life) is resumed with
``Last-Event-ID``: no gaps, no repeats. The stream's parsing is :mod:`privtrain.event_stream`
(re-exported here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

from privtrain.event_stream import ACCESS_REVOKED, SseMessage, events_from_stream, parse_sse
from privtrain.events import JobFeed
from privtrain.progress import JobProgress
from privtrain.resources import TERMINAL_STATUSES, Job, JobEvent

__all__ = [
    "ACCESS_REVOKED",
    "EVENT_UPDATES",
    "SseMessage",
    "events_from_stream",
    "parse_sse",
    "sse_progress",
]


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


def sse_progress(client: JobFeed, job_id: str, *, poll_interval: float) -> Iterator[JobProgress]:
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
            for event in client.list_events(job_id, after=after):
                epsilon_spent = _epsilon(event, epsilon_spent)
