"""RDP -> (epsilon, delta), and the per-order capacity that is its exact inverse.

Conversion of Canonne, Kamath and Steinke 2020 (Prop. 12 of arXiv:2004.00010v4, also Asoodeh et
al. 2020): an (a, r)-RDP mechanism is (eps, delta)-DP with

    eps = r + log1p(-1/a) - (log(delta) + log(a)) / (a - 1),

minimised over the orders of the grid. The ledger splits its delta evenly over the orders
(union bound over the per-order filters), so the ledger's epsilon is the conversion at
delta / |ORDERS|, and the capacity at order a is that same formula solved for r. Epsilons are
rounded up, capacities down (docs/privacy-model.md#ledger).

Everything works with log delta, never with a product or quotient of delta: rows stored before
new budgets were held to DELTA_MIN may carry a subnormal delta (5e-324), whose delta / |ORDERS|
underflows to 0. log of a subnormal is exact enough (and finite), so every function here is
total on 0 < delta < 1 and the tiny delta just costs a larger, still finite, epsilon.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence

from kernel.privacy.curves import validate_curve
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.orders import ORDERS, Curve
from kernel.privacy.rounding import round_down_sum, round_up, round_up_sum


def validate_delta(delta: float) -> float:
    """The math's domain, 0 < delta < 1, subnormals included: stored rows may hold any such delta.

    New inputs are held to the narrower kernel.privacy.ranges.DELTA_MIN at the API edge.
    """
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 < float(delta) < 1.0:
        raise PrivacyEventError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def validate_epsilon(epsilon: float) -> float:
    """A target or budget epsilon must be finite and positive."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise PrivacyEventError(f"epsilon must be a number, got {epsilon!r}")
    value = float(epsilon)
    if not math.isfinite(value) or value <= 0.0:
        raise PrivacyEventError(f"epsilon must be finite and > 0, got {epsilon!r}")
    return value


def per_order_log_delta(delta: float) -> float:
    """log of the delta each order's filter gets, delta / |ORDERS| (union bound), without underflow.

    The quotient is formed while it is a normal float, so the ledger's numbers for every delta it
    ever accepted stay bit-identical; below that the logs are subtracted (delta / 20 would round,
    even to 0, and a rounded-up delta would understate epsilon).
    """
    delta = validate_delta(delta)
    share = delta / len(ORDERS)
    if share >= sys.float_info.min:
        return math.log(share)
    return math.log(delta) - math.log(len(ORDERS))


def conversion_terms(order: float, log_delta: float) -> tuple[float, float]:
    """The two delta-dependent terms added to r at order a: eps(a) = r + t0 + t1 (given log delta)."""
    return math.log1p(-1.0 / order), -(log_delta + math.log(order)) / (order - 1.0)


def _epsilon_at_log_delta(curve: Sequence[float], log_delta: float) -> tuple[float, float]:
    values = validate_curve(curve, name="RDP curve", allow_inf=True)
    best_epsilon = math.inf
    best_order = ORDERS[0]
    for order, rdp in zip(ORDERS, values, strict=True):
        if math.isinf(rdp):
            continue
        candidate = round_up_sum((rdp, *conversion_terms(order, log_delta)))
        if candidate < best_epsilon:
            best_epsilon, best_order = candidate, order
    return max(0.0, best_epsilon), best_order


def epsilon_from_rdp(curve: Sequence[float], delta: float) -> tuple[float, float]:
    """(epsilon, best order) of an RDP curve at ``delta``; epsilon rounded up, clamped at 0."""
    return _epsilon_at_log_delta(curve, math.log(validate_delta(delta)))


def ledger_epsilon(curve: Sequence[float], delta: float) -> float:
    """The epsilon the ledger reports for a curve: the conversion at delta / |ORDERS|."""
    return _epsilon_at_log_delta(curve, per_order_log_delta(delta))[0]


def capacity_curve(epsilon: float, delta: float) -> Curve:
    """C(a): the largest RDP at order a that converts to (epsilon, delta/|ORDERS|); rounded down, >= 0."""
    epsilon = validate_epsilon(epsilon)
    log_order_delta = per_order_log_delta(delta)
    capacity: list[float] = []
    for order in ORDERS:
        t0, t1 = conversion_terms(order, log_order_delta)
        capacity.append(max(0.0, round_down_sum((epsilon, -t0, -t1))))
    return tuple(capacity)


def delta_from_rdp(curve: Sequence[float], epsilon: float) -> float:
    """The smallest delta over the grid with (epsilon, delta)-DP by the conversion above solved for
    delta: log delta = (a-1)(r(a) + log(1-1/a) - epsilon) - log a. Rounded up; 1 (always valid)
    where the conversion gives more."""
    best = 1.0
    for order, value in zip(ORDERS, curve, strict=True):
        w = order - 1.0
        log_delta = round_up_sum((w * value, w * math.log1p(-1.0 / order), -w * epsilon, -math.log(order)))
        if log_delta < 0.0:
            best = min(best, round_up(math.exp(log_delta)))
    return best
