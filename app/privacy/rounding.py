"""Outward rounding: the one place that decides how floating-point error is kept on the safe side.

privacy.md §4 says "round costs up, capacities down". Every cost value (an RDP curve entry, a sum
of curves, a reported epsilon) goes through :func:`round_up`; every capacity value goes through
:func:`round_down`. Both move by a relative ``RELATIVE_SLACK`` and then one more ulp, which
dominates the rounding error of any single float operation (at most half an ulp, ~1.1e-16
relative) with four orders of magnitude to spare, so a value rounded this way is on the safe side
of the exact result of the operation that produced it.

Exact zero is left alone: a sum or difference of non-negative floats is zero only when it is
exactly zero, so there is nothing to round. (Mechanisms whose closed form could underflow to zero
are guarded in :mod:`app.privacy.rdp`.)

Differences of two stored floats are the one exception to the relative slack:
:func:`difference_up` recovers the exact rounding error of ``x - y`` (Knuth's TwoSum) and returns
the smallest float >= the exact difference, so taking a reservation back out of a total restores
the total as closely as floats allow while never undershooting it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

RELATIVE_SLACK: float = 1e-12


def round_up(value: float) -> float:
    """A float >= value, for costs: the error of the computation must never lower a cost."""
    if value == 0.0 or math.isnan(value) or math.isinf(value):
        return value
    widened = value + abs(value) * RELATIVE_SLACK
    return math.nextafter(widened, math.inf)


def round_down(value: float) -> float:
    """A float <= value, for capacities: the error of the computation must never raise a capacity."""
    if value == 0.0 or math.isnan(value) or math.isinf(value):
        return value
    narrowed = value - abs(value) * RELATIVE_SLACK
    return math.nextafter(narrowed, -math.inf)


def difference_up(x: float, y: float) -> float:
    """The smallest float >= the exact value of x - y (finite inputs)."""
    d = x - y
    if math.isinf(d) or math.isnan(d):
        return d
    # Knuth's TwoSum of x and -y: x - y == d + err exactly, |err| <= half an ulp of d.
    x_virtual = d + y
    minus_y_virtual = d - x_virtual
    err = (x - x_virtual) + (-y - minus_y_virtual)
    return math.nextafter(d, math.inf) if err > 0.0 else d


def round_up_all(values: Iterable[float]) -> tuple[float, ...]:
    """Round every entry of a cost curve up."""
    return tuple(round_up(v) for v in values)


def round_down_all(values: Iterable[float]) -> tuple[float, ...]:
    """Round every entry of a capacity curve down."""
    return tuple(round_down(v) for v in values)


def round_up_sum(terms: Iterable[float]) -> float:
    """An upper bound on the sum of terms that each carry a few ulps of error.

    Unlike :func:`round_up` this stays safe under cancellation: the slack scales with the sum of
    the magnitudes of the terms, not with the (possibly tiny) result.
    """
    values = tuple(terms)
    total = math.fsum(values)
    if math.isinf(total) or math.isnan(total):
        return total
    slack = math.fsum(abs(v) for v in values) * RELATIVE_SLACK
    return math.nextafter(total + slack, math.inf)


def round_down_sum(terms: Iterable[float]) -> float:
    """A lower bound on the sum of terms that each carry a few ulps of error (see round_up_sum)."""
    values = tuple(terms)
    total = math.fsum(values)
    if math.isinf(total) or math.isnan(total):
        return total
    slack = math.fsum(abs(v) for v in values) * RELATIVE_SLACK
    return math.nextafter(total - slack, -math.inf)
