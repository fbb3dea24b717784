"""Validation and arithmetic of RDP curves (one float per order of ``ORDERS``).

Sums are costs and are rounded up. A difference is used to take a released reservation out of a
running total, and that total is still a cost, so it is rounded up as well, but only to the
nearest float above the exact difference (no relative slack): released capacity is never more
than was reserved, ``subtract_curves(add_curves(u, r), r) >= u`` at every order, and a
difference that is exact in floating point (e.g. ``subtract_curves(c, c)``) is returned as is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.orders import ORDERS, Curve
from kernel.privacy.rounding import difference_up, round_up


def validate_curve(curve: Sequence[float], *, name: str, allow_inf: bool = False) -> Curve:
    """Check length, NaN, sign (and optionally inf) of a curve; return it as a float tuple."""
    values = tuple(curve)
    if len(values) != len(ORDERS):
        raise PrivacyEventError(f"{name} has {len(values)} values; expected {len(ORDERS)} (one per order)")
    out: list[float] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PrivacyEventError(f"{name} contains a non-number: {value!r}")
        number = float(value)
        if math.isnan(number):
            raise PrivacyEventError(f"{name} contains NaN")
        if math.isinf(number) and not allow_inf:
            raise PrivacyEventError(f"{name} contains an infinite value")
        if number < 0.0:
            raise PrivacyEventError(f"{name} contains a negative value: {number!r}")
        out.append(number)
    return tuple(out)


def zero_curve() -> Curve:
    """The cost of doing nothing."""
    return tuple(0.0 for _ in ORDERS)


def add_curves(a: Sequence[float], b: Sequence[float]) -> Curve:
    """Order-wise sum, rounded up (composition of two costs)."""
    left = validate_curve(a, name="curve a")
    right = validate_curve(b, name="curve b")
    return tuple(round_up(x + y) for x, y in zip(left, right, strict=True))


def max_curves(curves: Iterable[Sequence[float]]) -> Curve:
    """Order-wise maximum of at least one curve: exact, so no rounding (a bound on any of them)."""
    validated = [validate_curve(curve, name="curve") for curve in curves]
    if not validated:
        raise PrivacyEventError("the maximum of no curves is undefined")
    return tuple(max(values) for values in zip(*validated, strict=True))


def subtract_curves(a: Sequence[float], b: Sequence[float]) -> Curve:
    """Order-wise ``a - b`` clamped at 0: the smallest float >= the exact difference at each order."""
    left = validate_curve(a, name="curve a")
    right = validate_curve(b, name="curve b")
    return tuple(max(0.0, difference_up(x, y)) for x, y in zip(left, right, strict=True))


def scale_curve(curve: Sequence[float], count: int) -> Curve:
    """``count`` sequential uses of a cost: the curve times count, rounded up (count >= 1)."""
    values = validate_curve(curve, name="curve")
    if count == 1:
        return values
    scaled = tuple(round_up(value * count) for value in values)
    if not all(math.isfinite(value) for value in scaled):
        raise PrivacyEventError(f"{count} uses of this cost overflow")
    return scaled
