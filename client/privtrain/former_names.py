"""The client's method names before it took one naming rule, kept as deprecated aliases.

The rule (docs/client-and-cli.md, "Method names"): ``get_<thing>(id)`` reads one thing,
``list_<things>()`` reads a list, ``iter_<things>()`` pages through it lazily; every other method
is a verb (``submit``, ``cancel``, ``upload_dataset``…). Each former name still works, warns once
per call site (DeprecationWarning) and calls the new one.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["FORMER_NAMES", "FormerNames"]

FORMER_NAMES: dict[str, str] = {
    "budget": "get_budget",
    "ledger": "list_ledger",
    "tokenizers": "list_tokenizers",
    "tokenizer": "get_tokenizer",
    "grants": "list_grants",
    "invitations": "list_invitations",
    "algorithms": "list_algorithms",
    "models": "list_models",
    "events": "list_events",
    "report": "get_report",
    "job": "get_job",
}
"""Former (or expected) name → the method under the rule."""


def _alias(former: str, current: str) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"Client.{former}() is deprecated: use Client.{current}()", DeprecationWarning, stacklevel=2)
        return getattr(self, current)(*args, **kwargs)

    call.__name__ = former
    call.__doc__ = f"Deprecated: :meth:`{current}`."
    return call


class FormerNames:
    """Mixed into ``Client``: the former names, each calling its current method with a warning."""


for _former, _current in FORMER_NAMES.items():
    setattr(FormerNames, _former, _alias(_former, _current))
