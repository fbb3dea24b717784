"""JSON from a client, parsed within bounds on its size, nesting depth and number length.

Why not plain ``json.loads``: on hostile input it fails in ways no caller expects. An integer of
more than 4,300 digits raises a bare ``ValueError`` (Python's int-string limit), deep nesting a
``RecursionError`` (or, just under the interpreter's limit, a value that later code recursing
over it cannot handle: pydantic's serializer stops at a few hundred levels), and ``1e999`` or
``NaN`` become non-finite floats. Here the text is scanned before anything is parsed: its depth
is measured and its number literals' lengths checked, without recursion and ignoring what is
inside strings (RFC 8259 §9 lets a parser limit both). Every refusal is one :class:`JsonRefused`
with a stable ``reason``, a ``detail`` that says what kind of problem and a ``position`` (a
character offset, where known), never the value: the JSON may hold private values.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["JsonBounds", "JsonReason", "JsonRefused", "check_bounds", "loads_bounded", "nesting_depth"]

JsonReason = Literal["too-large", "too-deep", "number-too-long", "non-finite-number", "invalid-json"]

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
"""A complete JSON string literal (escapes included); what is inside never nests."""
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET = re.compile(r"[\[\]{}]")
_NUMBER_CHARS = frozenset("0123456789.eE+-")


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
    """JSON refused: ``reason`` is stable, ``detail`` says what kind of problem, ``position`` is
    the character offset where it starts (None where unknown); never a value from the JSON."""

    reason: JsonReason
    detail: str
    position: int | None

    def __init__(self, reason: JsonReason, detail: str, *, position: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.position = position


def _without_strings(text: str) -> str:
    """``text`` with every string literal's content blanked: same length, same offsets."""
    return _STRING.sub(lambda literal: '"' + " " * (len(literal.group()) - 2) + '"', text)


def _depths(brackets: str) -> np.ndarray:
    """The depth after each bracket of a text holding brackets only."""
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    return np.cumsum(np.where((codes == ord("[")) | (codes == ord("{")), 1, -1), dtype=np.int64)


def nesting_depth(text: str) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings do not count).

    Linear and non-recursive, so it measures any input safely before a recursive parser sees it.
    An unterminated string's brackets are counted: that can only over-state the depth of text
    that is not JSON anyway.
    """
    return int(_depths(_NOT_BRACKET.sub("", _STRING.sub("", text))).max(initial=0))


def _too_deep_at(text: str, max_depth: int) -> int | None:
    """Where a bracket first opens level ``max_depth + 1``, or None."""
    if text.count("[") + text.count("{") <= max_depth:  # a fast C count rules most text out
        return None
    blanked = _without_strings(text)
    over = np.flatnonzero(_depths(_NOT_BRACKET.sub("", blanked)) > max_depth)
    if not over.size:
        return None
    bracket = next(itertools.islice(_BRACKET.finditer(blanked), int(over[0]), None))
    return bracket.start()


@functools.cache
def _long_digits(max_number_chars: int) -> re.Pattern[str]:
    """A run of digits that every number literal longer than ``max_number_chars`` holds: a
    literal is [-]I[.F][e±E], so its three digit runs hold at least length - 4 digits together."""
    return re.compile(rf"[0-9]{{{(max_number_chars - 4) // 3 + 1},}}")


def _long_number_at(text: str, max_number_chars: int) -> int | None:
    """Where the first number literal longer than ``max_number_chars`` starts, or None."""
    pattern = _long_digits(max_number_chars)
    if pattern.search(text) is None:  # a fast C search rules most text out
        return None
    blanked = _without_strings(text)
    for run in pattern.finditer(blanked):  # outside strings: part of a number literal (or junk)
        start, end = run.start(), run.end()
        while start > 0 and blanked[start - 1] in _NUMBER_CHARS:
            start -= 1
        while end < len(blanked) and blanked[end] in _NUMBER_CHARS:
            end += 1
        if end - start > max_number_chars:
            return start
    return None


def check_bounds(text: str, bounds: JsonBounds) -> None:
    """Refuse ``text`` if it is too long, nests too deep or holds a number literal too long,
    before any parser sees it (:class:`JsonRefused` with the position)."""
    if len(text) > bounds.max_chars:
        raise JsonRefused("too-large", f"the JSON has {len(text)} characters; at most {bounds.max_chars} are allowed")
    deep = _too_deep_at(text, bounds.max_depth)
    if deep is not None:
        raise JsonRefused(
            "too-deep", f"JSON arrays and objects nest more than {bounds.max_depth} levels deep", position=deep
        )
    long = _long_number_at(text, bounds.max_number_chars)
    if long is not None:
        raise JsonRefused(
            "number-too-long", f"a JSON number has more than {bounds.max_number_chars} characters", position=long
        )


def _refuse_constant(name: str) -> float:
    raise JsonRefused("non-finite-number", f"{name} is not a number JSON allows")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JsonRefused("non-finite-number", "a JSON number is too large for a 64-bit float")
    return value


def loads_bounded(text: str, *, bounds: JsonBounds) -> object:
    """``text`` parsed as JSON, or :class:`JsonRefused`: too long, too deep, a number literal
    too long or (unless allowed) not finite (``NaN``, ``Infinity``, ``1e999``), or not JSON at all."""
    check_bounds(text, bounds)
    try:
        if bounds.allow_non_finite:
            return json.loads(text)  # json's cached decoder: JSON Lines records are parsed by the million
        return json.loads(text, parse_float=_finite_float, parse_constant=_refuse_constant)
    except JsonRefused:
        raise
    except json.JSONDecodeError as exc:
        raise JsonRefused(
            "invalid-json", f"not valid JSON ({exc.msg} at character {exc.pos + 1})", position=exc.pos
        ) from None
    except (ValueError, RecursionError):  # defence in depth: the scan above should prevent these
        raise JsonRefused("invalid-json", "not valid JSON") from None
