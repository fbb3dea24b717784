"""RDP -> (epsilon, delta), and the per-order capacity that is its exact inverse.

Conversion of Canonne, Kamath and Steinke 2020 (Prop. 12 of arXiv:2004.00010v4, also Asoodeh et
al. 2020): an (a, r)-RDP mechanism is (eps, delta)-DP with

    eps = r + log1p(-1/a) - (log(delta) + log(a)) / (a - 1),

minimised over the orders of the grid. The ledger splits its delta evenly over the orders
(union bound over the per-order filters), so the ledger's epsilon is the conversion at
delta / |ORDERS|, and the capacity at order a is that same formula solved for r. Epsilons are
rounded up, capacities down (privacy.md §4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.privacy.curves import validate_curve
from app.privacy.errors import PrivacyEventError
from app.privacy.orders import ORDERS, Curve
from app.privacy.ranges import DELTA_MIN
from app.privacy.rounding import round_down_sum, round_up_sum


def validate_delta(delta: float) -> float:
    """delta must be in [DELTA_MIN, 1): smaller ones underflow in delta / |ORDERS| and log(delta)."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not DELTA_MIN <= float(delta) < 1.0:
        raise PrivacyEventError(f"delta must be in [{DELTA_MIN:g}, 1), got {delta!r}")
    return float(delta)


def validate_epsilon(epsilon: float) -> float:
    """A target or budget epsilon must be finite and positive."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise PrivacyEventError(f"epsilon must be a number, got {epsilon!r}")
    value = float(epsilon)
    if not math.isfinite(value) or value <= 0.0:
        raise PrivacyEventError(f"epsilon must be finite and > 0, got {epsilon!r}")
    return value


def per_order_delta(delta: float) -> float:
    """The delta each order's filter gets: delta / |ORDERS| (union bound)."""
    return validate_delta(delta) / len(ORDERS)


def conversion_terms(order: float, delta: float) -> tuple[float, float]:
    """The two delta-dependent terms added to r at order a: eps(a) = r + t0 + t1."""
    return math.log1p(-1.0 / order), -(math.log(delta) + math.log(order)) / (order - 1.0)


def epsilon_from_rdp(curve: Sequence[float], delta: float) -> tuple[float, float]:
    """(epsilon, best order) of an RDP curve at ``delta``; epsilon rounded up, clamped at 0."""
    values = validate_curve(curve, name="RDP curve", allow_inf=True)
    delta = validate_delta(delta)
    best_epsilon = math.inf
    best_order = ORDERS[0]
    for order, rdp in zip(ORDERS, values, strict=True):
        if math.isinf(rdp):
            continue
        candidate = round_up_sum((rdp, *conversion_terms(order, delta)))
        if candidate < best_epsilon:
            best_epsilon, best_order = candidate, order
    return max(0.0, best_epsilon), best_order


def ledger_epsilon(curve: Sequence[float], delta: float) -> float:
    """The epsilon the ledger reports for a curve: the conversion at delta / |ORDERS|."""
    return epsilon_from_rdp(curve, per_order_delta(delta))[0]


def capacity_curve(epsilon: float, delta: float) -> Curve:
    """C(a): the largest RDP at order a that converts to (epsilon, delta/|ORDERS|); rounded down, >= 0."""
    epsilon = validate_epsilon(epsilon)
    order_delta = per_order_delta(delta)
    capacity: list[float] = []
    for order in ORDERS:
        t0, t1 = conversion_terms(order, order_delta)
        capacity.append(max(0.0, round_down_sum((epsilon, -t0, -t1))))
    return tuple(capacity)
