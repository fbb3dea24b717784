"""Plain-text rendering for the CLI: aligned tables and key/value blocks (no extra deps)."""

from __future__ import annotations

import datetime as dt
import json
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


def truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class Column(Generic[T]):
    header: str
    get: Callable[[T], Any]
    width: int = 60  # longest cell shown; longer text is cut with '…'


def table(rows: Sequence[T], columns: Sequence[Column[T]]) -> str:
    cells = [[truncate(fmt(c.get(row)), c.width) for c in columns] for row in rows]
    headers = [c.header for c in columns]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {fmt(v)}" for k, v in pairs)


def to_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
