"""Opaque keyset cursors: stable under inserts, unlike offsets."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

from app.problems import Problem


def encode_cursor(values: list[Any]) -> str:
    raw = json.dumps(values, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, *, arity: int) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        values = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(status=422, slug="invalid-cursor", detail="malformed cursor") from exc
    if not isinstance(values, list) or len(values) != arity:
        raise Problem(status=422, slug="invalid-cursor", detail="malformed cursor")
    return values


def cursor_time(value: Any) -> dt.datetime:
    try:
        return dt.datetime.fromisoformat(str(value))
    except ValueError as exc:
        raise Problem(status=422, slug="invalid-cursor", detail="malformed cursor") from exc
