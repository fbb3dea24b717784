"""Opaque keyset cursors: stable under inserts, unlike offsets.

A cursor comes back from the client, so it is hostile input: ``decode_cursor`` checks the arity
and every value's type and range against the route's declared fields, and answers any mismatch
with one 422 ``invalid-cursor`` problem. Callers only ever see values their query can bind (no
oversized integers, no surrogates or NUL in strings, no out-of-range dates), so no cursor can
reach the database as a 500.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from kernel.errors import InvalidInput

__all__ = [
    "MAX_CURSOR_CHARS",
    "CursorField",
    "cursor_id",
    "cursor_seq",
    "cursor_time",
    "decode_cursor",
    "encode_cursor",
]

CursorField = Callable[[Any], Any]
"""Parses one decoded JSON value; raises ValueError (or TypeError) if it is not acceptable."""

MAX_CURSOR_CHARS = 1024
"""Our own cursors are well under 200 characters; anything longer is not one of ours."""

_MAX_SEQ = 2**63 - 1  # a signed 64-bit column: larger integers overflow the driver
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _invalid() -> InvalidInput:
    return InvalidInput(slug="invalid-cursor", detail="malformed cursor")


def encode_cursor(values: list[Any]) -> str:
    raw = json.dumps(values, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_seq(value: Any) -> int:
    """A ledger sequence number: a JSON integer (not a bool) in the column's range."""
    if type(value) is not int or not 0 <= value <= _MAX_SEQ:
        raise ValueError("not a sequence number")
    return value


def cursor_id(value: Any) -> str:
    """A row id as ``new_id`` makes them: short, ASCII, no NUL or surrogates."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise ValueError("not an id")
    return value


def cursor_time(value: Any) -> dt.datetime:
    """An ISO 8601 timestamp, as UTC (naive means UTC, as the database stores them)."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError("not a timestamp")
    parsed = dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)  # OverflowError near year 1 or 9999: caught by the caller


def _json_values(cursor: str) -> Any:
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ValueError("cursor too long")
    padded = cursor + "=" * (-len(cursor) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))


def decode_cursor(cursor: str, *, fields: Sequence[CursorField]) -> list[Any]:
    """The cursor's values, each parsed by its field; 422 ``invalid-cursor`` on any mismatch."""
    try:
        values = _json_values(cursor)
        if not isinstance(values, list) or len(values) != len(fields):
            raise ValueError("wrong arity")
        return [field(value) for field, value in zip(fields, values, strict=True)]
    except (ValueError, TypeError, OverflowError, RecursionError, binascii.Error) as exc:
        raise _invalid() from exc
