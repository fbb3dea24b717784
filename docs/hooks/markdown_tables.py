"""Small helpers the generated reference pages share: one Markdown table cell, one JSON schema type."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def cell(text: object) -> str:
    """Text safe inside a Markdown table cell: pipes escaped, line breaks flattened."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; every cell goes through :func:`cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def code(value: object) -> str:
    """A value as inline code (JSON for anything that is not a string)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f"`{text}`"


_BOUNDS = (
    ("exclusiveMinimum", "> {}"),
    ("minimum", "≥ {}"),
    ("exclusiveMaximum", "< {}"),
    ("maximum", "≤ {}"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
)


def schema_type(schema: Mapping[str, Any]) -> str:
    """A short human reading of a JSON schema's type: 'number', 'one of "a", "b"', 'array of integer'."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if "anyOf" in schema:
        return " or ".join(schema_type(option) for option in schema["anyOf"])
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    kind = schema.get("type", "any")
    if kind == "array":
        items = schema.get("items") or schema.get("prefixItems")
        if isinstance(items, list):
            return "array [" + ", ".join(schema_type(item) for item in items) + "]"
        return f"array of {schema_type(items)}" if items else "array"
    return str(kind)


def schema_bounds(schema: Mapping[str, Any]) -> str:
    """The numeric and size bounds of a schema (and of the options of an anyOf), comma separated."""
    parts = [template.format(schema[key]) for key, template in _BOUNDS if key in schema]
    for option in schema.get("anyOf", ()):
        parts += [template.format(option[key]) for key, template in _BOUNDS if key in option]
    return ", ".join(parts)
