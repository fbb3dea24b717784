"""The server's event stream read as job events: the WHATWG Server-Sent-Events format, parsed.

Pure parsing, no connection: :meth:`privtrain.Client.stream_events` feeds it the response's
lines, and :mod:`privtrain.sse` turns the events into progress snapshots.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from privtrain.resources import JobEvent

ACCESS_REVOKED = "access-revoked"
"""The server's last message on a stream whose reader lost access; it carries no job data."""


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


def events_from_stream(lines: Iterable[str]) -> Iterator[JobEvent]:
    """Job events from an event-stream body (each ``data`` is one JobEventOut as JSON).

    ``access-revoked`` (the key was revoked or the job may no longer be read) ends the body; the
    caller's reconnect then meets the server's 401/404 and raises it as a proper error.
    """
    for message in parse_sse(lines):
        if message.event == ACCESS_REVOKED:
            return
        yield JobEvent.from_api(json.loads(message.data))
