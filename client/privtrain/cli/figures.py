"""How privacy figures read in the CLI's tables: never more favourable than they are."""

from __future__ import annotations

from privtrain_common.directed_rounding import format_guarantee, format_remaining


def up(value: float | None) -> str | None:
    """A guarantee (ε or δ spent, charged, reserved, committed) for a table: rounded toward +∞ so
    it never reads smaller than it is; None stays None (shown as '-')."""
    return None if value is None else format_guarantee(value)


def down(value: float | None) -> str | None:
    """A remaining budget for a table: rounded toward −∞ so it never reads larger than it is."""
    return None if value is None else format_remaining(value)
