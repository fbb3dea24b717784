"""Where a request body stops being JSON, in words: what was expected, at which line and column.

FastAPI reports a body that ``json.loads`` rejects as a bare ``json_invalid`` error carrying json's
terse message and a character offset; a client editing a file by hand wants
"expected ',' or '}' at line 3, column 14 (character 52)". Offsets follow Python's json module
(``character`` counts from 0, ``line`` and ``column`` from 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Context:
    """What the text just before the error says about it."""

    enclosing: str | None
    """'{' or '[' if the error is inside an object or array, else None."""
    after_comma: bool
    """The last character before the error (spaces aside) is a comma."""
    at: str
    """The character at the error ('' at the end of the body)."""


def _context(doc: str, position: int) -> _Context:
    """One pass over ``doc[:position]``: the innermost open bracket outside strings."""
    stack: list[str] = []
    in_string = escaped = False
    for char in doc[:position]:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and stack:
            stack.pop()
    before = doc[:position].rstrip()
    return _Context(
        enclosing=stack[-1] if stack else None,
        after_comma=before.endswith(","),
        at=doc[position : position + 1],
    )


def _expected_comma(context: _Context) -> str:
    closer = {"{": "}", "[": "]"}.get(context.enclosing or "")
    return f"expected ',' or '{closer}'" if closer else "expected ','"


def _expected_name(context: _Context) -> str:
    if context.after_comma and context.at == "}":
        return "a trailing comma before '}' (JSON allows none)"
    return "expected a field name in double quotes"


def _expected_value(context: _Context) -> str:
    if context.after_comma and context.at == "]":
        return "a trailing comma before ']' (JSON allows none)"
    if context.at == "'":
        return "a single quote (JSON strings use double quotes)"
    return "expected a value (a string in double quotes, a number, an object, an array, true, false or null)"


_PHRASES: dict[str, Callable[[_Context], str]] = {
    "Expecting ',' delimiter": _expected_comma,
    "Expecting property name enclosed in double quotes": _expected_name,
    "Expecting value": _expected_value,
    "Expecting ':' delimiter": lambda _context: "expected ':' after the field name",
    "Extra data": lambda _context: "unexpected text after the end of the JSON value",
    "Unterminated string starting at": lambda _context: "a string that is never closed starts",
    "Invalid control character at": lambda _context: (
        "a raw control character inside a string (write a newline as \\n, a tab as \\t)"
    ),
    "Invalid \\escape": lambda _context: "an invalid backslash escape",
    "Illegal trailing comma before end of object": lambda _context: "a trailing comma before '}' (JSON allows none)",
    "Illegal trailing comma before end of array": lambda _context: "a trailing comma before ']' (JSON allows none)",
}
"""json's messages (CPython's decoder and scanner) → words; anything else is passed through."""


@dataclass(frozen=True)
class JsonErrorPosition:
    text: str
    """e.g. "expected ',' or '}' at line 3, column 14 (character 52)"."""
    line: int | None
    column: int | None
    character: int | None

    def members(self) -> dict[str, Any]:
        """The problem's machine-readable ``position`` member (empty when unknown)."""
        if self.character is None:
            return {}
        return {"position": {"line": self.line, "column": self.column, "character": self.character}}


def describe(*, body: Any, error: Mapping[str, Any], fallback: str) -> JsonErrorPosition:
    """Words for FastAPI's ``json_invalid`` ``error`` on ``body`` (the text json rejected)."""
    loc = tuple(error.get("loc", ()))
    position = loc[-1] if loc and isinstance(loc[-1], int) else None
    ctx = error.get("ctx") or {}
    message = str(ctx.get("error") or fallback)
    if position is None or not isinstance(body, str) or not 0 <= position <= len(body):
        return JsonErrorPosition(text=message, line=None, column=None, character=position)
    phrase = _PHRASES.get(message)
    words = phrase(_context(body, position)) if phrase else message[:1].lower() + message[1:]
    line = body.count("\n", 0, position) + 1
    column = position - (body.rfind("\n", 0, position) + 1) + 1
    return JsonErrorPosition(
        text=f"{words} at line {line}, column {column} (character {position})",
        line=line,
        column=column,
        character=position,
    )
