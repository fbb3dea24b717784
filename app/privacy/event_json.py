"""Versioned JSON form of privacy events, stored with every job and ledger entry.

Parsing is strict because the stored JSON is the charged cost: an unknown kind, a missing or
extra key, a wrong version, a non-finite or non-positive parameter all raise
:class:`PrivacyEventError` instead of being guessed at. Field validation itself lives in the event
classes, so the codec only checks the shape.
"""

from __future__ import annotations

from typing import Any, Final

from app.privacy.errors import PrivacyEventError
from app.privacy.events import EVENT_KINDS, ComposedEvent, PrivacyEvent, field_names

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
    if isinstance(event, ComposedEvent):
        return {"kind": ComposedEvent.KIND, "events": [_encode(child) for child in event.events]}
    body: dict[str, Any] = {"kind": event.KIND}
    for name in field_names(type(event)):
        body[name] = getattr(event, name)
    return body


def _decode(node: Any, *, depth: int, budget: list[int]) -> PrivacyEvent:
    """Decode one node; ``budget`` counts the nodes left so that a huge tree is refused early."""
    if depth > MAX_COMPOSITION_DEPTH:
        raise PrivacyEventError(f"event tree deeper than {MAX_COMPOSITION_DEPTH}")
    budget[0] -= 1
    if budget[0] < 0:
        raise PrivacyEventError(f"event tree has more than {MAX_EVENT_NODES} nodes")
    if not isinstance(node, dict):
        raise PrivacyEventError("every event must be a JSON object")
    kind = node.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_KINDS:
        raise PrivacyEventError(f"unknown event kind {kind!r}")
    event_type = EVENT_KINDS[kind]
    expected = {"kind", *field_names(event_type)}
    if set(node) != expected:
        raise PrivacyEventError(
            f"event of kind {kind!r} must have exactly the keys {sorted(expected)}, got {sorted(map(str, node))}"
        )
    if event_type is ComposedEvent:
        children = node["events"]
        if not isinstance(children, list):
            raise PrivacyEventError("composed.events must be a list")
        return ComposedEvent(tuple(_decode(child, depth=depth + 1, budget=budget) for child in children))
    values = {name: node[name] for name in field_names(event_type)}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PrivacyEventError(f"{kind}.{name} must be a JSON number, got {value!r}")
    event: PrivacyEvent = event_type(**values)
    return event
