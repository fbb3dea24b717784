"""How a zoo model's parameters are declared: a frozen dataclass whose fields carry their bounds.

Declared once, read by both sides: the torch builders take their defaults from it, and the
service turns the same declaration into the schema it validates a job's ``model.params`` with
(and publishes in its catalogue). A declaration needs nothing installed: a field's bounds are
plain field metadata (:class:`Bounds`), and the rules that tie several fields together run in
the dataclass's ``__post_init__``, raising ValueError.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

T = TypeVar("T")

_BOUNDS_KEY = "privtrain.bounds"


class ParamsSpec(Protocol):
    """A parameter declaration: any dataclass (its instances are validated parameters)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """What a parameter may be, named as the validating schema names them (None: unbounded)."""

    ge: int | None = None
    le: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    description: str | None = None


def param(default: T, *, ge: int | None = None, le: int | None = None, description: str | None = None) -> T:
    """A field with an immutable default (a number, a string, a bool, None) and its bounds."""
    return dataclasses.field(default=default, metadata={_BOUNDS_KEY: Bounds(ge=ge, le=le, description=description)})


def list_param(
    default: tuple[int, ...], *, min_length: int, max_length: int, description: str | None = None
) -> list[int]:
    """A list-of-integers field (each instance gets its own copy of ``default``) and its length bounds."""
    return dataclasses.field(
        default_factory=lambda: list(default),
        metadata={_BOUNDS_KEY: Bounds(min_length=min_length, max_length=max_length, description=description)},
    )


def object_param(default: Mapping[str, object], *, description: str | None = None) -> dict[str, Any]:
    """A JSON-object field (each instance gets its own copy of ``default``), for a parameter that is a
    whole document, such as a Transformers config; its rules live in the dataclass's ``__post_init__``."""
    return dataclasses.field(
        default_factory=lambda: copy.deepcopy(dict(default)), metadata={_BOUNDS_KEY: Bounds(description=description)}
    )


def declared_fields(spec: type[ParamsSpec]) -> tuple[dataclasses.Field[Any], ...]:
    """The declaration's fields, in order (a subclass's after its parent's)."""
    return dataclasses.fields(spec)


def bounds(declared: dataclasses.Field[Any]) -> Bounds:
    """A field's bounds; a field declared without ``param`` or ``list_param`` has none."""
    found = declared.metadata.get(_BOUNDS_KEY)
    return found if isinstance(found, Bounds) else Bounds()


def default_factory(declared: dataclasses.Field[Any]) -> Callable[[], object] | None:
    """The factory of a field whose default is built per instance (a list, an object), else None."""
    factory = declared.default_factory
    return None if factory is dataclasses.MISSING else factory


def defaults(spec: type[ParamsSpec]) -> dict[str, object]:
    """Every parameter with its default: what a job that names the model without params gets."""
    values: dict[str, object] = {}
    for declared in declared_fields(spec):
        factory = default_factory(declared)
        values[declared.name] = factory() if factory is not None else declared.default
    return values
