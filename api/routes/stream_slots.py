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

from api.limits.capped_slots import CappedSlots, SlotsFull
from api.routes.slot_problems import app_registry, slots_full_problem
from kernel.config import Settings

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
    return app_registry(
        app,
        attribute="stream_slots",
        make=lambda: CappedSlots(
            total=settings.sse_max_streams_total,
            per_owner=settings.sse_max_streams_per_key,
            owner_scope="per-key",
            what="event streams",
        ),
    )


def take_stream_slot(app: FastAPI, settings: Settings, *, principal: str) -> StreamSlot:
    """A slot for the key with digest ``principal``, or a 429 ``too-many-streams`` problem."""
    slots = stream_slots_of(app, settings)
    try:
        slots.acquire(principal)
    except SlotsFull as exc:
        raise slots_full_problem(
            exc,
            slug="too-many-streams",
            summary="too many open event streams",
            advice=f"close one or retry in {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S,
        ) from exc
    return StreamSlot(slots=slots, principal=principal)
