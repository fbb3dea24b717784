"""JSON from a client, parsed within bounds on its size, nesting depth and number length.

Why not plain ``json.loads``: on hostile input it fails in ways no caller expects. An integer of
more than 4,300 digits raises a bare ``ValueError`` (Python's int-string limit), deep nesting a
``RecursionError`` (or, just under the interpreter's limit, a value that later code recursing
over it cannot handle), and ``1e999`` or ``NaN`` become non-finite floats. Here the depth is
measured before anything is parsed, numbers are length-checked before they are converted, and
every refusal is one :class:`JsonRefused` with a stable ``reason`` and a ``detail`` that says
where (a character position), never what: the JSON may hold private values.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["JsonBounds", "JsonReason", "JsonRefused", "loads_bounded", "nesting_depth"]

JsonReason = Literal["too-large", "too-deep", "number-too-long", "non-finite-number", "invalid-json"]

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A complete JSON string literal (escapes included); what is inside never nests."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


@dataclass(frozen=True)
class JsonBounds:
    """The most a caller accepts; the defaults suit a small declaration (params, a preparation)."""

    max_chars: int
    max_depth: int = 32
    """Arrays and objects inside one another: ``[]`` is depth 1, ``{"a": [1]}`` depth 2."""
    max_number_chars: int = 100
    """Characters in one number literal: far beyond any float64 or 64-bit integer, far below the
    4,300 digits at which Python refuses to convert an integer string."""
    allow_non_finite: bool = False
    """Accept ``NaN``, ``Infinity`` and overflowing literals (``1e999``) as floats, as Python's
    json does: for documents whose numbers the caller does not use (JSON Lines records)."""

    def __post_init__(self) -> None:
        if min(self.max_chars, self.max_depth, self.max_number_chars) < 1:
            raise ValueError("JsonBounds must be positive")


class JsonRefused(ValueError):
    """JSON refused: ``reason`` is stable, ``detail`` says where (a position), never a value."""

    reason: JsonReason
    detail: str

    def __init__(self, reason: JsonReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count).

    Linear and non-recursive, so it measures any input safely before a recursive parser sees it.
    An unterminated string's brackets are counted: that can only over-state the depth of text
    that is not JSON anyway.
    """
    brackets = np.frombuffer(_NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii"), dtype=np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


@functools.cache
def _long_digits(max_number_chars: int) -> re.Pattern[str]:
    """A run of digits that every number literal longer than ``max_number_chars`` holds: a
    literal is [-]I[.F][e±E], so its three digit runs hold at least length - 4 digits together."""
    return re.compile(rf"\d{{{(max_number_chars - 4) // 3 + 1},}}")


def _refuse_constant(name: str) -> float:
    raise JsonRefused("non-finite-number", f"{name} is not a number JSON allows")


def loads_bounded(text: str, *, bounds: JsonBounds) -> object:
    """``text`` parsed as JSON, or :class:`JsonRefused`: too long, too deep, a number literal
    too long or (unless allowed) not finite (``NaN``, ``Infinity``, ``1e999``), or not JSON at all."""
    if len(text) > bounds.max_chars:
        raise JsonRefused("too-large", f"the JSON has {len(text)} characters; at most {bounds.max_chars} are allowed")
    # Counting the opening brackets is a fast C loop; only text that could nest deeply is scanned.
    if text.count("[") + text.count("{") > bounds.max_depth and nesting_depth(text) > bounds.max_depth:
        raise JsonRefused("too-deep", f"JSON arrays and objects nest more than {bounds.max_depth} levels deep")

    def number(literal: str) -> None:
        if len(literal) > bounds.max_number_chars:
            raise JsonRefused("number-too-long", f"a JSON number has more than {bounds.max_number_chars} characters")

    def parse_int(literal: str) -> int:
        number(literal)
        return int(literal)

    def parse_float(literal: str) -> float:
        number(literal)
        value = float(literal)
        if not (bounds.allow_non_finite or math.isfinite(value)):
            raise JsonRefused("non-finite-number", "a JSON number is too large for a 64-bit float")
        return value

    # The hooks cost a decoder built per call and a Python call per number. Text without the digit
    # run a too-long literal needs (_long_digits) cannot hold one: where non-finite floats are
    # allowed too (JSON Lines records, parsed by the million), json's own cached decoder reads it.
    plain = bounds.allow_non_finite and _long_digits(bounds.max_number_chars).search(text) is None
    try:
        if plain:
            return json.loads(text)
        constant = float if bounds.allow_non_finite else _refuse_constant
        return json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=constant)
    except JsonRefused:
        raise
    except json.JSONDecodeError as exc:
        raise JsonRefused("invalid-json", f"not valid JSON ({exc.msg} at character {exc.pos + 1})") from None
    except (ValueError, RecursionError):  # defence in depth: the bounds above should prevent these
        raise JsonRefused("invalid-json", "not valid JSON") from None
