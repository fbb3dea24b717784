"""The configuration reference page, generated from ``kernel.config.Settings`` (pydantic-settings)."""

from __future__ import annotations

import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

from markdown_tables import code, table
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kernel.config import Settings

PAGE_URI = "reference/configuration.md"

_INTRO = """# Configuration reference

Generated from `kernel.config.Settings` when the site is built, so it lists exactly the settings the
code reads. Every setting is an environment variable with the prefix `PRIVTRAIN_`; the API and the
workers read the same variables. How to run the service with them:
[Configuration](../configuration.md) and [Operating it](../operations.md).
"""


def env_var(field_name: str) -> str:
    """The environment variable pydantic-settings reads for a field."""
    prefix = Settings.model_config.get("env_prefix", "")
    return f"{prefix}{field_name}".upper()


def type_name(annotation: Any) -> str:
    """A readable type: 'float', 'str or unset', 'one of development, test, production'."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(str(value) for value in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        options = [type_name(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        suffix = " or unset" if type(None) in typing.get_args(annotation) else ""
        return " or ".join(options) + suffix
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def default_text(field: FieldInfo) -> str:
    """The default as shown to an operator: unset for None, the value otherwise."""
    if field.default is PydanticUndefined:
        return "required"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return code("true" if value else "false")
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return code(str(value))


def number_text(value: object) -> str:
    """A bound as an operator would type it: 1000000 rather than 1e+06, 0.5 as it is."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def bounds_text(field: FieldInfo) -> str:
    """The validation bounds pydantic enforces (gt, ge, lt, le, lengths)."""
    symbols = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "length ≥", "max_length": "length ≤"}
    parts: list[str] = []
    for constraint in field.metadata:
        for attribute, symbol in symbols.items():
            value = getattr(constraint, attribute, None)
            if value is not None:
                parts.append(f"{symbol} {number_text(value)}")
    return ", ".join(parts)


def render_configuration_page() -> str:
    """The whole page: one table row per settings field, in declaration order."""
    rows = [
        (
            code(env_var(name)),
            type_name(field.annotation),
            default_text(field),
            bounds_text(field),
            field.description or "",
        )
        for name, field in Settings.model_fields.items()
    ]
    return _INTRO + "\n" + table(("variable", "type", "default", "valid values", "meaning"), rows) + "\n"
