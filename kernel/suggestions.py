"""'Did you mean …?' for names a client mistyped, worded the same everywhere.

Algorithm, model, hyperparameter, model-parameter and request-field names all go through here, so
a typo anywhere in a job spec gets the same kind of answer: the closest known names (difflib,
cutoff 0.6: 'dp-adma' → 'dp-adam', 'epsilon' → 'target_epsilon'), or, when nothing is close,
the names that are allowed (if there are few enough to read).
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pydantic import BaseModel

MATCH_CUTOFF: Final[float] = 0.6
MAX_MATCHES: Final[int] = 3
RUNNER_UP_MARGIN: Final[float] = 0.1
"""A further match is offered only if its similarity is within this of the best one's."""
MAX_LISTED: Final[int] = 24
"""Above this many known names the message does not list them (a catalogue endpoint does)."""


def close_matches(name: str, known: Iterable[str]) -> list[str]:
    """The known names closest to ``name``, best first: at most three, and only those about as
    close as the best (so 'dp-adma' gets 'dp-adam', not also the merely similar 'dp-sgd')."""
    matches = difflib.get_close_matches(name, sorted(set(known)), n=MAX_MATCHES, cutoff=MATCH_CUTOFF)
    if not matches:
        return []
    scores = [difflib.SequenceMatcher(None, name, match).ratio() for match in matches]
    return [match for match, score in zip(matches, scores, strict=True) if score >= scores[0] - RUNNER_UP_MARGIN]


def _quoted(names: Sequence[str], *, joiner: str) -> str:
    quoted = [f"'{name}'" for name in names]
    if len(quoted) <= 2:
        return f" {joiner} ".join(quoted)
    return ", ".join(quoted[:-1]) + f", {joiner} " + quoted[-1]


def hint(name: str, known: Iterable[str]) -> str:
    """'did you mean 'x'?', else 'expected one of: …' / 'no fields are accepted here'; '' if too many to list."""
    names = sorted(set(known))
    matches = close_matches(name, names)
    if matches:
        return f"did you mean {_quoted(matches, joiner='or')}?"
    if not names:
        return "no fields are accepted here"
    if len(names) <= MAX_LISTED:
        return "expected one of: " + ", ".join(f"'{known_name}'" for known_name in names)
    return ""


def with_hint(message: str, name: str, known: Iterable[str]) -> str:
    """``message`` followed by '; <hint>' when there is one."""
    extra = hint(name, known)
    return f"{message}; {extra}" if extra else message


def unknown_name(*, kind: str, name: str, known: Iterable[str]) -> str:
    """ "unknown algorithm 'dp-adma'; did you mean 'dp-adam'?"."""
    return with_hint(f"unknown {kind} '{name}'", name, known)


def accepted_fields(model: type[BaseModel]) -> list[str]:
    """The keys a client may send for ``model`` (aliases where a field has one)."""
    return [field.alias or name for name, field in model.model_fields.items()]


def _forbids_extra(model: type[BaseModel]) -> bool:
    return model.model_config.get("extra") == "forbid"


def unknown_field(*, given: Mapping[str, Any], model: type[BaseModel], where: str) -> str | None:
    """'<where>.<key>: unknown field; did you mean …' for the first key ``model`` would reject as
    extra, or None when every key is accepted (or the model accepts anything)."""
    if not _forbids_extra(model):
        return None
    accepted = accepted_fields(model)
    for key in given:
        if key not in accepted:
            return with_hint(f"{where}.{key}: unknown field", str(key), accepted)
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold: ``X``, ``X | None``, ``Optional[X]``."""
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]
    return []


def fields_at(model: type[BaseModel], path: Sequence[str | int]) -> list[str] | None:
    """The field names accepted at ``path`` inside ``model``; None when the path leaves the
    nested models (a free-form dict, a list) or the model there accepts any key."""
    current = model
    for part in path:
        by_key = {field.alias or name: field for name, field in current.model_fields.items()}
        field = by_key.get(str(part))
        nested = _models_in(field.annotation) if field is not None else []
        if len(nested) != 1:
            return None
        current = nested[0]
    return accepted_fields(current) if _forbids_extra(current) else None


def extra_field_hint(*, model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """The hint for pydantic's ``extra_forbidden`` error at ``loc`` (relative to ``model``); ''
    when the accepted names there are not known."""
    if not loc:
        return ""
    known = fields_at(model, loc[:-1])
    return hint(str(loc[-1]), known) if known is not None else ""
