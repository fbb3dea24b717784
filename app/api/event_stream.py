"""A job's events as Server-Sent Events: the same payloads as the JSON list, pushed as they land.

Why polling the database: events are written by workers in other processes; the table is the
one source of truth in every deployment mode (SQLite or PostgreSQL, filesystem broker or Redis),
and a short indexed query per interval is cheap. Each poll opens and closes its own short read
session, so a long-lived stream never pins a connection or a transaction.

The protocol (https://html.spec.whatwg.org/multipage/server-sent-events.html):

- every event carries ``id: <seq>``, ``event: <kind>`` and ``data: <JobEventOut JSON>``;
- a client that reconnects sends ``Last-Event-ID`` and resumes after it (no gaps, no repeats);
- a comment line ``: keep-alive`` every ``keepalive_s`` keeps proxies from closing an idle stream;
- ``retry:`` tells browsers how long to wait before reconnecting;
- the stream ends once the job is terminal and every event has been sent, or after
  ``max_stream_s`` (the client reconnects with Last-Event-ID), so no stream lives forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sqlalchemy import select

from app.db import Database
from app.models import TERMINAL_STATUSES, Job, JobEvent
from app.job_views import event_out
from app.schemas.jobs import JobEventOut

__all__ = ["EVENT_STREAM_MEDIA_TYPE", "StreamTiming", "format_event", "job_event_stream", "wants_event_stream"]

EVENT_STREAM_MEDIA_TYPE = "text/event-stream"
BATCH = 500


@dataclass(frozen=True)
class StreamTiming:
    poll_interval_s: float
    keepalive_s: float
    max_stream_s: float
    retry_ms: int = 2000


def wants_event_stream(accept: str | None) -> bool:
    """True if the Accept header names text/event-stream (with or without parameters)."""
    if not accept:
        return False
    return any(part.split(";")[0].strip().lower() == EVENT_STREAM_MEDIA_TYPE for part in accept.split(","))


def format_event(event: JobEventOut) -> str:
    """One SSE message; the JSON has no newlines, so a single data line suffices."""
    data = json.dumps(event.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"


def _poll(db: Database, job_id: str, after: int) -> tuple[list[JobEventOut], bool]:
    """Events after `after` (one batch) and whether the job was terminal BEFORE they were read,
    so a terminal job's last events are always in this or an earlier batch."""
    with db.read_session() as session:
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        rows = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after)
            .order_by(JobEvent.seq).limit(BATCH)
        ).all()
        events = [event_out(e) for e in rows]
    return events, status in TERMINAL_STATUSES


def job_event_stream(
    *,
    db: Database,
    job_id: str,
    after: int,
    timing: StreamTiming,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[str]:
    """The SSE body for one job, starting after event `after`."""
    started = last_sent = clock()
    yield f"retry: {timing.retry_ms}\n\n"
    while True:
        events, terminal = _poll(db, job_id, after)
        for event in events:
            after = event.seq
            yield format_event(event)
        if len(events) == BATCH:
            continue  # more are waiting: no sleep
        if terminal:
            return  # status was read before the events, so the job's last event has been sent
        if events:
            last_sent = clock()
        now = clock()
        if now - started >= timing.max_stream_s:
            return
        if now - last_sent >= timing.keepalive_s:
            yield ": keep-alive\n\n"
            last_sent = now
        sleep(timing.poll_interval_s)
