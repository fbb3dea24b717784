"""Caps on open event streams: per API key and in total, per API process.

Why: a stream lives for minutes (``sse_max_stream_s``) and costs a connection, a socket and a
database poll every ``sse_poll_interval_s``; without a cap one key could open thousands. The
principal is the API key (its digest), whatever carries it, so Bearer streams on ``/v1`` and the
dashboard's cookie streams on ``/ui`` count against one cap. A full cap answers 429 at once,
before the stream starts; the slot is released when the stream ends, however it ends.
"""

from __future__ import annotations

import threading

from fastapi import FastAPI

from app.capped_slots import CappedSlots, SlotsFull
from app.config import Settings
from app.problems import Problem

__all__ = ["RETRY_AFTER_S", "StreamSlot", "stream_slots_of", "take_stream_slot"]

RETRY_AFTER_S = 5


class StreamSlot:
    """One held slot. ``release`` may be called from every way a stream ends; only the first counts."""

    def __init__(self, *, slots: CappedSlots, principal: str) -> None:
        self._slots = slots
        self._principal = principal
        self._lock = threading.Lock()
        self._released = False
        self.handed_over = False
        """Set once a stream owns the slot: from then on only the stream's end releases it."""

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._slots.release(self._principal)


def stream_slots_of(app: FastAPI, settings: Settings) -> CappedSlots:
    """The app's registry, made on first use (each app, and so each test, has its own)."""
    slots = getattr(app.state, "stream_slots", None)
    if slots is None:
        slots = CappedSlots(total=settings.sse_max_streams_total, per_owner=settings.sse_max_streams_per_key,
                            owner_scope="per-key", what="event streams")
        app.state.stream_slots = slots
    return slots


def take_stream_slot(app: FastAPI, settings: Settings, *, principal: str) -> StreamSlot:
    """A slot for the key with digest ``principal``, or a 429 ``too-many-streams`` problem."""
    slots = stream_slots_of(app, settings)
    try:
        slots.acquire(principal)
    except SlotsFull as exc:
        raise Problem(
            status=429,
            slug="too-many-streams",
            detail=f"too many open event streams ({exc.scope} limit {exc.limit}); close one or retry in "
            f"{RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
            extra={"limit": exc.limit, "scope": exc.scope},
        ) from exc
    return StreamSlot(slots=slots, principal=principal)
