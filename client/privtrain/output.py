"""Plain-text rendering for the CLI: aligned tables and key/value blocks (no extra deps)."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def fmt(value: Any) -> str:
    """Short human form: floats to 4 significant digits, times to the second, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def wrapped(text: str, width: int) -> list[str]:
    """The cell's lines: text longer than ``width`` wraps onto more lines (never cut), long words
    (a JSON object without spaces) split where they must."""
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


@dataclass(frozen=True)
class Column(Generic[T]):
    header: str
    get: Callable[[T], Any]
    width: int = 60  # widest cell line; longer text wraps onto the next lines of its row


def table(rows: Sequence[T], columns: Sequence[Column[T]]) -> str:
    cells = [[wrapped(fmt(c.get(row)), c.width) for c in columns] for row in rows]
    headers = [c.header for c in columns]
    widths = [max([len(h)] + [len(line) for r in cells for line in r[i]]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        for depth in range(max(len(cell) for cell in row)):
            parts = [(cell[depth] if depth < len(cell) else "").ljust(w) for cell, w in zip(row, widths, strict=True)]
            lines.append("  ".join(parts).rstrip())
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {fmt(v)}" for k, v in pairs)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
