"""Reading an upload's body with a deadline: a client must keep sending, and fast enough.

Why: an upload holds an upload slot (api/limits/upload_slots.py), a temp file and a connection. A
client that sends a few bytes a second (slowloris) or stops sending would hold them for ever,
and a handful of such clients would take every upload slot. So each chunk must arrive within
``idle_timeout_s``, and after ``grace_s`` the average rate must stay above
``min_rate_bytes_per_s``; the wait for the next chunk is cut at whichever deadline comes first,
so a slow client is refused at most ``max(grace_s, received / min_rate)`` seconds after it starts
(not when its next byte happens to arrive).

The file writes go to a worker thread in batches, so the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

import anyio.to_thread

from kernel.config import Settings

__all__ = ["UploadPace", "UploadTooSlow", "receive_paced"]

WRITE_BATCH_BYTES = 1 << 20
"""Bytes gathered before one write in a thread: few thread hops, bounded memory per upload."""


@dataclass(frozen=True)
class UploadPace:
    idle_timeout_s: float
    min_rate_bytes_per_s: float
    grace_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadPace:
        return cls(
            idle_timeout_s=settings.upload_idle_timeout_s,
            min_rate_bytes_per_s=settings.upload_min_rate_bytes_per_s,
            grace_s=settings.upload_rate_grace_s,
        )

    def rate_deadline(self, *, started: float, received: int) -> float:
        """When the average rate falls below the minimum unless more bytes arrive."""
        return started + max(self.grace_s, received / self.min_rate_bytes_per_s)


class UploadTooSlow(Exception):
    """The client stopped sending (``idle``) or sent below the minimum rate (``rate``)."""

    def __init__(self, reason: Literal["idle", "rate"], *, received: int, elapsed_s: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.received = received
        self.elapsed_s = elapsed_s


async def receive_paced(
    chunks: AsyncIterator[bytes],
    write: Callable[[bytes], None],
    *,
    pace: UploadPace,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Copy ``chunks`` to ``write`` (called in a worker thread); the bytes received.

    Raises UploadTooSlow when the client misses a deadline; the caller discards what was written.
    """
    started = clock()
    received = 0
    buffer = bytearray()
    iterator = chunks.__aiter__()
    while True:
        now = clock()
        idle_deadline = now + pace.idle_timeout_s
        rate_deadline = pace.rate_deadline(started=started, received=received)
        wait = min(idle_deadline, rate_deadline) - now
        try:
            if wait <= 0:
                raise TimeoutError
            async with asyncio.timeout(wait):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            break
        except TimeoutError:
            reason: Literal["idle", "rate"] = "rate" if rate_deadline <= idle_deadline else "idle"
            raise UploadTooSlow(reason, received=received, elapsed_s=clock() - started) from None
        received += len(chunk)
        buffer += chunk
        if len(buffer) >= WRITE_BATCH_BYTES:
            await anyio.to_thread.run_sync(write, bytes(buffer))
            buffer.clear()
    if buffer:
        await anyio.to_thread.run_sync(write, bytes(buffer))
    return received
