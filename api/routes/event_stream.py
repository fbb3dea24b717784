"""A job's events as Server-Sent Events: the same payloads as the JSON list, pushed as they land.

Why polling the database: events are written by workers in other processes; the table is the
one source of truth in every deployment mode (SQLite or PostgreSQL, filesystem broker or Redis),
and a short indexed query per interval is cheap. Each poll opens and closes its own short read
session, so a long-lived stream never pins a connection or a transaction.

Why async: a stream spends nearly all its life waiting. It waits on the event loop
(``anyio.sleep``), holding no thread; each poll (a few indexed queries) runs in a worker thread
under this module's own capacity limiter (``POLL_THREADS``), never under the limiter that
Starlette's sync routes share. So open streams can neither starve those routes nor block the
loop. (The old sync generator slept inside the shared 40-thread pool: 45 open streams made every
sync route wait 13–15 s.)

Why access is re-checked at every poll, in the poll's own read session: a stream lives for
minutes, and a key revoked, a grant withdrawn or a dashboard logged out must stop it at the next
poll, not when it would have ended anyway. The stream then sends ``event: access-revoked``
(``data: {}``, nothing of the job) and closes.

The protocol (https://html.spec.whatwg.org/multipage/server-sent-events.html):

- every event carries ``id: <seq>`` (its number within the job, 1, 2, 3 …), ``event: <kind>``
  and ``data: <JobEventOut JSON>``;
- a client that reconnects sends ``Last-Event-ID`` and resumes after it (no gaps, no repeats);
- a comment line ``: keep-alive`` every ``keepalive_s`` keeps proxies from closing an idle stream;
- ``retry:`` tells browsers how long to wait before reconnecting;
- the stream ends once the job is terminal and every event has been sent, after
  ``max_stream_s`` (the client reconnects with Last-Event-ID), or when access is lost, so no
  stream lives forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
from anyio import CapacityLimiter
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.types import Receive, Scope, Send

from api.job_views import event_out
from api.limits.rate_limit import bearer_principal
from api.limits.request_cap import known_unverified, release_request_slot
from api.routes.stream_slots import StreamSlot, take_stream_slot
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, JobEvent
from kernel.jobs.status import TERMINAL_STATUSES
from kernel.schemas.jobs import JobEventOut
from kernel.services import Services

__all__ = [
    "ACCESS_REVOKED_MESSAGE",
    "EVENT_STREAM_MEDIA_TYPE",
    "AccessCheck",
    "EventStreamResponse",
    "StreamTiming",
    "event_stream_response",
    "format_event",
    "job_event_stream",
    "poll_limiter_of",
    "resume_point",
    "wants_event_stream",
]

EVENT_STREAM_MEDIA_TYPE = "text/event-stream"
BATCH = 500
POLL_THREADS = 8
"""Polls running at once, all streams of the process together (each takes milliseconds)."""
MAX_SEQ = 2**62
ACCESS_REVOKED_MESSAGE = "event: access-revoked\ndata: {}\n\n"
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

AccessCheck = Callable[[Session], bool]
"""True while the stream's principal may still read the job; runs inside each poll's session."""


@dataclass(frozen=True)
class StreamTiming:
    poll_interval_s: float
    keepalive_s: float
    max_stream_s: float
    retry_ms: int = 2000

    @classmethod
    def from_settings(cls, settings: Settings) -> StreamTiming:
        return cls(
            poll_interval_s=settings.sse_poll_interval_s,
            keepalive_s=settings.sse_keepalive_s,
            max_stream_s=settings.sse_max_stream_s,
        )


def wants_event_stream(accept: str | None) -> bool:
    """True if the Accept header names text/event-stream (with or without parameters)."""
    if not accept:
        return False
    return any(part.split(";")[0].strip().lower() == EVENT_STREAM_MEDIA_TYPE for part in accept.split(","))


def resume_point(after: int, last_event_id: str | None) -> int:
    """Where a stream starts: after ``after`` or the ``Last-Event-ID`` a reconnecting client sends,
    whichever is later; an absent or unusable header means ``after``."""
    resumed = 0
    if last_event_id is not None and last_event_id.strip().isdigit():
        resumed = int(last_event_id.strip())
    return min(max(after, resumed), MAX_SEQ)


def format_event(event: JobEventOut) -> str:
    """One SSE message; the JSON has no newlines, so a single data line suffices."""
    data = json.dumps(event.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"


@dataclass(frozen=True)
class _Poll:
    allowed: bool
    events: list[JobEventOut]
    terminal: bool


def _poll(db: Database, job_id: str, after: int, still_allowed: AccessCheck) -> _Poll:
    """Access first; then events after `after` (one batch) and whether the job was terminal
    BEFORE they were read, so a terminal job's last events are always in this or an earlier batch."""
    with db.read_session() as session:
        if not still_allowed(session):
            return _Poll(allowed=False, events=[], terminal=False)
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        rows = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after).order_by(JobEvent.seq).limit(BATCH)
        ).all()
        events = [event_out(e) for e in rows]
    return _Poll(allowed=True, events=events, terminal=status in TERMINAL_STATUSES)


async def job_event_stream(
    *,
    db: Database,
    job_id: str,
    after: int,
    timing: StreamTiming,
    still_allowed: AccessCheck,
    limiter: CapacityLimiter,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> AsyncGenerator[str, None]:
    """The SSE body for one job, starting after event `after`."""
    started = last_sent = clock()
    yield f"retry: {timing.retry_ms}\n\n"
    while True:
        poll = await anyio.to_thread.run_sync(_poll, db, job_id, after, still_allowed, limiter=limiter)
        if not poll.allowed:
            yield ACCESS_REVOKED_MESSAGE
            return
        for event in poll.events:
            after = event.seq
            yield format_event(event)
        if len(poll.events) == BATCH:
            continue  # more are waiting: no sleep
        if poll.terminal:
            return  # status was read before the events, so the job's last event has been sent
        if poll.events:
            last_sent = clock()
        now = clock()
        if now - started >= timing.max_stream_s:
            return
        if now - last_sent >= timing.keepalive_s:
            yield ": keep-alive\n\n"
            last_sent = now
        await sleep(timing.poll_interval_s)


def poll_limiter_of(app: FastAPI) -> CapacityLimiter:
    """The app's poll limiter, made on first use: POLL_THREADS tokens of its own."""
    limiter = getattr(app.state, "sse_poll_limiter", None)
    if limiter is None:
        limiter = CapacityLimiter(POLL_THREADS)
        app.state.sse_poll_limiter = limiter
    return limiter


class EventStreamResponse(StreamingResponse):
    """An SSE response that runs ``on_close`` once it stops being served, whatever stopped it
    (job terminal, maximum life, access lost, client gone, server shutdown), and closes the
    generator there and then, so a stream slot is never left to the garbage collector."""

    def __init__(self, stream: AsyncGenerator[str, None], *, on_close: Callable[[], None]) -> None:
        super().__init__(stream, media_type=EVENT_STREAM_MEDIA_TYPE, headers=STREAM_HEADERS)
        self._stream = stream
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        release_request_slot(scope)  # a stream counts against the stream caps, not as a request
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()


async def reserve_stream_slot(request: Request) -> AsyncIterator[StreamSlot | None]:
    """Dependency: a stream slot for a Bearer request that asks for an event stream, taken on the
    event loop before authentication or any database work (None for other requests).

    Why first: a burst of stream requests beyond the cap would otherwise each cost a thread hop,
    an authentication and a job lookup before being refused; this way the 429 costs nothing. The
    slot is keyed by the key's digest, and taken only for a key the request cap found active
    (:mod:`api.limits.request_cap`): random keys take none, so they cannot fill the process's cap.
    Unless a stream took it over, it is released when the route returns, whatever it answered,
    and before that answer is sent (the route declares it with ``scope="function"``), so a
    client retrying at once never meets its own slot.
    """
    principal = bearer_principal(request.scope)
    if principal is None or known_unverified(request.scope) or not wants_event_stream(request.headers.get("accept")):
        yield None  # an unknown or revoked key takes no slot: the route answers 401
        return
    slot = take_stream_slot(request.app, request.app.state.services.settings, principal=principal)
    try:
        yield slot
    finally:
        if not slot.handed_over:
            slot.release()


def event_stream_response(
    *,
    app: FastAPI,
    services: Services,
    principal: str,
    job_id: str,
    after: int,
    still_allowed: AccessCheck,
    reserved: StreamSlot | None = None,
) -> EventStreamResponse:
    """A job's stream for the API key with digest ``principal``; a 429 problem, before anything is
    sent, if the key or the process has too many streams open (unless ``reserved`` holds its slot)."""
    slot = reserved if reserved is not None else take_stream_slot(app, services.settings, principal=principal)
    slot.handed_over = True
    stream = job_event_stream(
        db=services.db,
        job_id=job_id,
        after=after,
        timing=StreamTiming.from_settings(services.settings),
        still_allowed=still_allowed,
        limiter=poll_limiter_of(app),
    )
    return EventStreamResponse(stream, on_close=slot.release)
