"""Running an upload's parse in a worker thread while watching its client and its deadline.

Why (issue 36): a crafted upload kept a worker thread decoding for ~100 s after its client had
gone, holding the tenant's upload slots. A thread cannot be stopped from outside, so the parse
runs under a :class:`~kernel.ingest.parse_control.ParseControl` that its readers check between
units of work; meanwhile the event loop asks the server every ``DISCONNECT_POLL_S`` whether the
client is still there and cancels the control when it is not. The parse then stops at its next
checkpoint, the route ends, and its upload slot is released (the dependency's teardown) at once.
A parse past its deadline raises ``ParseDeadlineExceeded`` (413 ``parse-deadline-exceeded``).
Either way the registration discards everything it had written (kernel/datasets/registration.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from api.problems import Problem
from kernel.ingest.parse_control import ParseCancelled, ParseControl

__all__ = ["DISCONNECT_POLL_S", "WatchedParse"]

P = ParamSpec("P")
T = TypeVar("T")

DISCONNECT_POLL_S = 0.25
"""How often the event loop looks for the client's disconnect: a cheap, non-blocking check."""

log = logging.getLogger("privtrain.api.uploads")


class WatchedParse:
    """``await WatchedParse(request, deadline_s=...).run(work, ...)``: ``work`` in a worker thread,
    stopped when the client disconnects or the deadline passes."""

    def __init__(self, request: Request, *, deadline_s: float) -> None:
        self._request = request
        self._deadline_s = deadline_s

    async def run(self, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``work(*args, **kwargs)``; its deadline counts from now."""
        control = ParseControl(deadline_s=self._deadline_s)
        watcher = asyncio.create_task(self._watch_client(control))
        try:
            return await run_in_threadpool(control.run, lambda: work(*args, **kwargs))
        except ParseCancelled:
            log.info("upload parse stopped: the client disconnected", extra={"path": self._request.url.path})
            # Nobody reads this answer (the client is gone); it ends the request without a 500.
            raise Problem(
                status=400, slug="client-disconnected", detail="the client disconnected; nothing was stored"
            ) from None
        finally:
            watcher.cancel()
            await asyncio.wait([watcher])

    async def _watch_client(self, control: ParseControl) -> None:
        """Cancel the parse when the server reports that the client has disconnected."""
        while not await self._request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)
        control.cancel()
