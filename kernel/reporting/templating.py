"""The Jinja2 environment shared by the HTML report and the dashboard.

Autoescaping is on for every template, whatever its extension: all values shown come from the
database or the report and some are user-chosen (dataset names, hyperparameter strings). Only
the server-generated SVG plots are passed as ``Markup``.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from privtrain_common.directed_rounding import format_guarantee, format_remaining

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


def format_number(value: Any, digits: int = 6) -> str:
    """Numbers for people: ``digits`` significant digits, nearest; ints, None and text unchanged.
    Not for privacy figures: those use the directed ``guarantee`` and ``remaining`` filters."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.{digits}g}"


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def guarantee_number(value: Any, *, digits: int = 6) -> str:
    """An ε or δ that states a guarantee (charged, reserved, committed, a job's ε or δ), rounded
    toward +∞: nearest rounding could print less than holds (3.00012 as ``3``)."""
    return format_guarantee(value, digits=digits) if _is_real(value) or value is None else str(value)


def remaining_number(value: Any, *, digits: int = 6) -> str:
    """A remaining budget (remaining ε, largest admissible ε), rounded toward −∞: it must never
    promise budget that is not there."""
    return format_remaining(value, digits=digits) if _is_real(value) or value is None else str(value)


def exact_number(value: Any) -> str:
    """The shortest round-tripping text of a float (for ``data-value`` attributes and audits)."""
    return repr(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)


def percent(part: float | None, whole: float | None) -> float:
    """A bar width in percent, clamped to 0..100 (for gauges; the numbers are shown beside them)."""
    if not part or not whole or whole <= 0:
        return 0.0
    return max(0.0, min(100.0, 100.0 * part / whole))


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = format_number
    env.filters["guarantee"] = guarantee_number
    env.filters["remaining"] = remaining_number
    env.filters["exact"] = exact_number
    env.filters["pretty_json"] = pretty_json
    env.globals["percent"] = percent
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
