"""A parse's deadline and its client's departure, checked by the readers between units of work.

Why: an upload is parsed in a worker thread, and a thread cannot be stopped from outside. A
crafted upload could keep it busy for minutes, holding the tenant's upload slot after the client
had long gone (issue 36). So every reader calls :func:`checkpoint` between units of work (CSV
lines, NPZ chunks, ZIP members, JSON Lines records); it raises when the parse is past its deadline
(:class:`ParseDeadlineExceeded`, a 413) or its client has disconnected (:class:`ParseCancelled`).
The API runs the parse under a :class:`ParseControl` (api/routes/upload_watch.py). The control is
ambient, a context variable set in the parsing thread, so the readers' signatures stay those the
worker calls too: the worker re-reads stored uploads without a control, and there
:func:`checkpoint` does nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TypeVar

from kernel.errors import TooLarge

__all__ = ["ParseCancelled", "ParseControl", "ParseDeadlineExceeded", "checkpoint"]

T = TypeVar("T")

_CURRENT: ContextVar[ParseControl | None] = ContextVar("privtrain_parse_control", default=None)


class ParseCancelled(Exception):
    """The client went away while its upload was parsed: the parse stopped, nothing was kept."""


class ParseDeadlineExceeded(TooLarge):
    """Parsing took longer than the deadline (``PRIVTRAIN_UPLOAD_PARSE_DEADLINE_S``)."""

    def __init__(self, deadline_s: float) -> None:
        super().__init__(
            slug="parse-deadline-exceeded",
            detail=f"parsing the upload took longer than {deadline_s:g} s, this service's limit; nothing was "
            "stored. Upload the data in smaller parts (or, for images, resized closer to the size you train on)",
            extra={"reason": "parse-deadline", "deadline_s": deadline_s},
        )


@dataclass
class ParseControl:
    """One parse's deadline and cancellation flag; :meth:`cancel` is safe from any thread."""

    deadline_s: float
    started: float = field(default_factory=time.monotonic)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def check(self) -> None:
        if self._cancelled.is_set():
            raise ParseCancelled("the client disconnected")
        if time.monotonic() - self.started > self.deadline_s:
            raise ParseDeadlineExceeded(self.deadline_s)

    def run(self, work: Callable[[], T]) -> T:
        """``work()`` with this control current (call it in the thread that parses)."""
        token = _CURRENT.set(self)
        try:
            return work()
        finally:
            _CURRENT.reset(token)


def checkpoint() -> None:
    """Raise if the current parse is past its deadline or its client left; a no-op without one."""
    control = _CURRENT.get()
    if control is not None:
        control.check()
