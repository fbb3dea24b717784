"""Response fields renamed to say what they hold, with their old names kept as deprecated aliases.

Why aliases: clients read ``epsilon_ledger``, ``epsilon_prv`` and ``epsilon_prv_method`` today. The
new names (``epsilon_reserved``, ``epsilon_single_job``, ``epsilon_single_job_method``) say what
the numbers are; the old ones stay in every response for one release, with the same value, marked
``deprecated: true`` in the OpenAPI schema (docs/epsilon.md#renamed-fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel, Field, model_validator

ALIASES_REMOVED_IN: Final[str] = "0.2.0"
"""The release whose responses no longer carry the deprecated names."""

RENAMED: Final[Mapping[str, str]] = {
    "epsilon_ledger": "epsilon_reserved",
    "epsilon_prv": "epsilon_single_job",
    "epsilon_prv_method": "epsilon_single_job_method",
}
"""Deprecated name → the field that replaced it."""


def deprecated_alias(old: str) -> Any:
    """The field of a deprecated name: the same value as its replacement (filled in by
    :class:`WithRenamedFields`), described and flagged as deprecated."""
    new = RENAMED[old]
    return Field(
        deprecated=f"renamed {new}; removed in privtrain {ALIASES_REMOVED_IN}",
        description=f"Deprecated: the former name of {new}, with the same value; removed in privtrain "
        f"{ALIASES_REMOVED_IN}.",
    )


class WithRenamedFields(BaseModel):
    """A response model that carries deprecated aliases: each is filled from its replacement."""

    @model_validator(mode="before")
    @classmethod
    def _fill_deprecated_aliases(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        filled = dict(data)
        for old, new in RENAMED.items():
            if old not in cls.model_fields:
                continue
            if new in filled:
                filled[old] = filled[new]
            elif not cls.model_fields[new].is_required():  # the replacement's default, as it will be
                filled[old] = cls.model_fields[new].get_default(call_default_factory=True)
        return filled
