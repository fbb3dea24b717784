"""Outward rounding: the one place that decides how floating-point error is kept on the safe side.

docs/privacy-model.md#ledger says: costs are rounded up, capacities down.

* :func:`round_up` for every cost value (an RDP curve entry, a sum of curves, a reported
  epsilon): it adds a relative ``RELATIVE_SLACK`` (1e-12) and then one more ulp, which dominates
  the error of the few float operations behind any one value (~1e-16 relative each) by four
  orders of magnitude.
* :func:`round_up_sum` / :func:`round_down_sum` for results that are sums of computed terms which
  may cancel (the epsilon <-> capacity conversion): the slack scales with the magnitudes of the
  terms, not with the possibly tiny result. Capacities use ``round_down_sum``.
* :func:`difference_up` for taking a reservation back out of a running total: the exact error of
  ``x - y`` is recovered (Knuth's TwoSum) and the smallest float >= the exact difference is
  returned, so the total never undershoots and an exact difference stays exact.

Exact zero is left alone: a sum or difference of non-negative floats is zero only when it is
exactly zero, so there is nothing to round. (Mechanisms whose closed form could underflow to zero
are guarded in :mod:`kernel.privacy.rdp`.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

RELATIVE_SLACK: Final[float] = 1e-12


def round_up(value: float) -> float:
    """A float >= value, for costs: the error of the computation must never lower a cost."""
    if value == 0.0 or math.isnan(value) or math.isinf(value):
        return value
    widened = value + abs(value) * RELATIVE_SLACK
    return math.nextafter(widened, math.inf)


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
