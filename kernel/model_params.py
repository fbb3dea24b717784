"""A zoo model's parameter schema as pydantic validates and publishes it.

The declaration lives once in ``privtrain_common.zoo`` (a plain dataclass with its bounds); this
turns it into the pydantic model the API validates ``model.params`` with and whose JSON schema
the catalogue publishes. The declaration's own rules (its ``__post_init__``) run as the model's
validator, so a broken rule reads as pydantic's "Value error, …".
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from privtrain_common.zoo.params import ParamsSpec, bounds, declared_fields, default_factory


class ZooParams(BaseModel):
    """The base of every model's parameters: an unknown parameter is refused, never ignored."""

    model_config = ConfigDict(extra="forbid")
    declaration: ClassVar[type[ParamsSpec]]

    @model_validator(mode="after")
    def _follows_the_declaration(self) -> Self:
        declared_params(self.declaration, self)  # raises the declaration's ValueError
        return self


def _field(declared: dataclasses.Field[Any]) -> Any:
    limits = bounds(declared)
    factory = default_factory(declared)
    constraints: dict[str, Any] = {
        "ge": limits.ge,
        "le": limits.le,
        "min_length": limits.min_length,
        "max_length": limits.max_length,
        "description": limits.description,
    }
    if factory is not None:
        return Field(default_factory=factory, **constraints)
    return Field(default=declared.default, **constraints)


def params_model(spec: type[ParamsSpec]) -> type[ZooParams]:
    """The pydantic model of ``spec``, named as the declaration is (its JSON schema's title)."""
    hints = typing.get_type_hints(spec)
    fields: dict[str, Any] = {
        declared.name: (hints[declared.name], _field(declared)) for declared in declared_fields(spec)
    }
    model = create_model(spec.__name__, __base__=ZooParams, **fields)
    model.declaration = spec
    return model


def declared_params(spec: type[ParamsSpec], parsed: BaseModel) -> Any:
    """The validated pydantic params as the declaration's dataclass, which the zoo's rules take."""
    return spec(**{declared.name: getattr(parsed, declared.name) for declared in declared_fields(spec)})
