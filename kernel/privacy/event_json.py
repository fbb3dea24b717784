"""Versioned JSON form of privacy events, stored with every job and ledger entry.

Parsing is strict because the stored JSON is the charged cost: an unknown kind, a missing or
extra key, a wrong version, a non-finite or non-positive parameter all raise
:class:`PrivacyEventError` instead of being guessed at. Field validation itself lives in the event
classes, so the codec only checks the shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.events import (
    EVENT_KINDS,
    TRIAL_DISTRIBUTION_KINDS,
    ComposedEvent,
    HyperparameterTuningEvent,
    PrivacyEvent,
    TrialDistribution,
    field_names,
)

EVENT_SCHEMA: Final[str] = "privtrain.privacy-event"
EVENT_SCHEMA_VERSION: Final[int] = 1
# Bounds on untrusted input: deep or huge trees are never legitimate job costs.
MAX_COMPOSITION_DEPTH: Final[int] = 32
MAX_EVENT_NODES: Final[int] = 10_000

_ENVELOPE_KEYS: Final[frozenset[str]] = frozenset({"schema", "version", "event"})


def event_to_json(event: PrivacyEvent) -> dict[str, Any]:
    """The event wrapped in its schema envelope (plain dicts, lists, floats, ints)."""
    return {"schema": EVENT_SCHEMA, "version": EVENT_SCHEMA_VERSION, "event": _encode(event)}


def event_from_json(data: dict[str, Any]) -> PrivacyEvent:
    """Parse the output of :func:`event_to_json`; reject anything else."""
    if not isinstance(data, dict):
        raise PrivacyEventError("privacy event JSON must be an object")
    keys = set(data)
    if keys != _ENVELOPE_KEYS:
        raise PrivacyEventError(
            f"privacy event JSON must have exactly the keys {sorted(_ENVELOPE_KEYS)}, got {sorted(map(str, keys))}"
        )
    if data["schema"] != EVENT_SCHEMA:
        raise PrivacyEventError(f"unknown event schema {data['schema']!r}")
    version = data["version"]
    if isinstance(version, bool) or not isinstance(version, int) or version != EVENT_SCHEMA_VERSION:
        raise PrivacyEventError(f"unsupported event schema version {version!r}")
    budget = [MAX_EVENT_NODES]
    return _decode(data["event"], depth=0, budget=budget)


def _encode(event: PrivacyEvent) -> dict[str, Any]:
    encode = _TREE_ENCODERS.get(type(event))
    if encode is not None:
        return encode(event)
    return _flat(event)


def _flat(value: Any) -> dict[str, Any]:
    """A leaf event or a trial distribution: its kind and its numeric fields."""
    body: dict[str, Any] = {"kind": value.KIND}
    for name in field_names(type(value)):
        body[name] = getattr(value, name)
    return body


def _encode_composed(event: Any) -> dict[str, Any]:
    return {"kind": ComposedEvent.KIND, "events": [_encode(child) for child in event.events]}


def _encode_tuning(event: Any) -> dict[str, Any]:
    return {
        "kind": HyperparameterTuningEvent.KIND,
        "distribution": _flat(event.distribution),
        "candidates": [_encode(candidate) for candidate in event.candidates],
    }


def _decode(node: Any, *, depth: int, budget: list[int]) -> PrivacyEvent:
    """Decode one node; ``budget`` counts the nodes left so that a huge tree is refused early."""
    if depth > MAX_COMPOSITION_DEPTH:
        raise PrivacyEventError(f"event tree deeper than {MAX_COMPOSITION_DEPTH}")
    budget[0] -= 1
    if budget[0] < 0:
        raise PrivacyEventError(f"event tree has more than {MAX_EVENT_NODES} nodes")
    event_type = _checked_type(node, EVENT_KINDS, what="event")
    decode = _TREE_DECODERS.get(event_type)
    if decode is not None:
        return decode(node, depth, budget)
    event: PrivacyEvent = event_type(**_numbers(node, event_type))
    return event


def _checked_type(node: Any, kinds: Any, *, what: str) -> type:
    """The registered class of a JSON object whose keys are exactly its kind and fields."""
    if not isinstance(node, dict):
        raise PrivacyEventError(f"every {what} must be a JSON object")
    kind = node.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise PrivacyEventError(f"unknown {what} kind {kind!r}")
    value_type: type = kinds[kind]
    expected = {"kind", *field_names(value_type)}
    if set(node) != expected:
        raise PrivacyEventError(
            f"{what} of kind {kind!r} must have exactly the keys {sorted(expected)}, got {sorted(map(str, node))}"
        )
    return value_type


def _numbers(node: dict[str, Any], value_type: type) -> dict[str, Any]:
    """The numeric fields of a flat node (range checks are the class's own)."""
    values = {name: node[name] for name in field_names(value_type)}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PrivacyEventError(f"{node['kind']}.{name} must be a JSON number, got {value!r}")
    return values


def _children(node: dict[str, Any], key: str, depth: int, budget: list[int]) -> tuple[PrivacyEvent, ...]:
    children = node[key]
    if not isinstance(children, list):
        raise PrivacyEventError(f"{node['kind']}.{key} must be a list")
    return tuple(_decode(child, depth=depth + 1, budget=budget) for child in children)


def _decode_composed(node: dict[str, Any], depth: int, budget: list[int]) -> PrivacyEvent:
    return ComposedEvent(_children(node, "events", depth, budget))


def _decode_tuning(node: dict[str, Any], depth: int, budget: list[int]) -> PrivacyEvent:
    distribution_type = _checked_type(node["distribution"], TRIAL_DISTRIBUTION_KINDS, what="trial distribution")
    distribution: TrialDistribution = distribution_type(**_numbers(node["distribution"], distribution_type))
    return HyperparameterTuningEvent(distribution, _children(node, "candidates", depth, budget))


# The kinds whose fields are events (everything else is a flat object of numbers).
_TREE_ENCODERS: Final[dict[type, Callable[[Any], dict[str, Any]]]] = {
    ComposedEvent: _encode_composed,
    HyperparameterTuningEvent: _encode_tuning,
}
_TREE_DECODERS: Final[dict[type, Callable[[dict[str, Any], int, list[int]], PrivacyEvent]]] = {
    ComposedEvent: _decode_composed,
    HyperparameterTuningEvent: _decode_tuning,
}
