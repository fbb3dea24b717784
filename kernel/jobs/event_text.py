"""A job's events as short sentences for people (the dashboard's event list).

One table of templates serves the server-rendered list and the page's live script (which gets
it as JSON and fills the same ``{field}`` placeholders), so the two never word an event
differently. ε fields are privacy guarantees: they print rounded up (``GUARANTEE_FIELDS``), here
by ``format_guarantee`` and in the browser by the script's own upward rounding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from privtrain_common.directed_rounding import format_guarantee

__all__ = ["EPSILON_DIGITS", "EVENT_SENTENCES", "GUARANTEE_FIELDS", "event_sentence"]

EVENT_SENTENCES: Mapping[str, str] = {
    "queued": "Admitted by the budget filter and queued; {steps_planned} steps planned.",
    "requeued": "The worker was lost; queued again for attempt {attempt}.",
    "started": "Attempt {attempt} started training.",
    "progress": "Step {step} of {steps_planned} done; ε spent so far {epsilon_spent}.",
    "cancel-requested": "Cancel requested: the job stops after its current step.",
    "cancelled": "Cancelled after {steps_run} steps.",
    "succeeded": "Finished {steps_run} steps; ε charged {epsilon_spent}.",
    "failed": "Failed ({error_code}).",
}
"""Templates by event kind; a kind not listed reads as the kind alone."""

GUARANTEE_FIELDS = frozenset({"epsilon_spent"})
EPSILON_DIGITS = 4
"""Significant digits of an ε in a sentence: the dashboard's usual four."""

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
MISSING = "?"


def _field_text(name: str, value: Any) -> str:
    if value is None:
        return MISSING
    if name in GUARANTEE_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_guarantee(float(value), digits=EPSILON_DIGITS)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def event_sentence(kind: str, payload: Mapping[str, Any]) -> str:
    """The sentence for one event; a missing field prints as ``?`` rather than failing the page."""
    template = EVENT_SENTENCES.get(kind)
    if template is None:
        return kind
    return _PLACEHOLDER.sub(lambda match: _field_text(match.group(1), payload.get(match.group(1))), template)
