"""The Rényi privacy filter: admission against per-order capacities, and the remaining budget.

A job is admitted iff at SOME order a of the grid committed(a) + reserved(a) + cost(a) <= C(a)
(docs/privacy-model.md#ledger). Everything here is a pure function of curves; locking and persistence belong
to kernel/ledger/operations.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from kernel.privacy.conversion import capacity_curve, conversion_terms, per_order_log_delta, validate_epsilon
from kernel.privacy.curves import validate_curve
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.orders import ORDERS
from kernel.privacy.rounding import round_up

# remaining_epsilon() backs off by this much so that a Gaussian calibrated to the number it
# returns is admitted despite the outward rounding of costs and capacities (~1e-12 relative).
_REMAINING_RELATIVE_BACKOFF: Final[float] = 1e-7
_REMAINING_CAPACITY_BACKOFF: Final[float] = 1e-8


def admission_order(
    *,
    committed: Sequence[float],
    reserved: Sequence[float],
    cost: Sequence[float],
    capacity: Sequence[float],
) -> int | None:
    """Index of the first order where the job fits (the witness), or None if it fits nowhere."""
    cost_values = validate_curve(cost, name="cost")
    committed_values = validate_curve(committed, name="committed")
    reserved_values = validate_curve(reserved, name="reserved")
    capacity_values = validate_curve(capacity, name="capacity")
    for index, (c, r, x, cap) in enumerate(
        zip(committed_values, reserved_values, cost_values, capacity_values, strict=True)
    ):
        if round_up(c + r + x) <= cap:
            return index
    return None


def remaining_epsilon(
    *, used: Sequence[float], capacity: Sequence[float], delta: float, budget_epsilon: float | None = None
) -> float:
    """Largest epsilon e such that one Gaussian mechanism calibrated to ledger epsilon e would
    still be admitted given ``used`` (committed + reserved); 0.0 if nothing fits.

    Solved in closed form, no bisection. A Gaussian costs rho*a at order a (rho = 1/(2 sigma^2)).
    Calibrated to e on a fresh ledger it gets the largest admitted rho, rho(e) = max_a C_e(a)/a
    with C_e(a) = e - t(a) (t: the conversion terms at delta/|ORDERS|). Given ``used`` it is
    admitted iff rho(e) <= rho_rem = max_a (capacity(a) - used(a)) / a, i.e. iff
    e <= a*rho_rem + t(a) for every a. Hence e_rem = min_a (a*rho_rem + t(a)), backed off by
    1e-7 relative + 1e-8 * max(capacity) to absorb rounding.

    ``budget_epsilon``: the budget eps_G that ``capacity`` is the capacity of (checked). Then
    nothing used answers exactly eps_G, and nothing else more than eps_G. Why exact: the closed
    form lands a rounding error below eps_G and the back-off takes 1e-7 more, so an untouched
    budget of 8 printed as 7.999. eps_G is what the filter admits there: a job calibrated to a
    target eps_G fits alone under capacity_curve(eps_G, delta) by the definition of calibration
    (kernel.privacy.calibration), and with nothing used that is the whole admission test.
    """
    used_values = validate_curve(used, name="used")
    capacity_values = validate_curve(capacity, name="capacity")
    budget = None if budget_epsilon is None else validate_epsilon(budget_epsilon)
    if budget is not None:
        if capacity_values != capacity_curve(budget, delta):
            raise PrivacyEventError(f"capacity is not the capacity of budget epsilon {budget!r} at delta {delta!r}")
        if not any(used_values):
            return budget
    log_order_delta = per_order_log_delta(delta)
    rho_remaining = max((cap - u) / order for cap, u, order in zip(capacity_values, used_values, ORDERS, strict=True))
    if not rho_remaining > 0.0:
        return 0.0
    epsilon = min(order * rho_remaining + sum(conversion_terms(order, log_order_delta)) for order in ORDERS)
    backoff = _REMAINING_RELATIVE_BACKOFF * abs(epsilon) + _REMAINING_CAPACITY_BACKOFF * max(capacity_values)
    epsilon -= backoff
    if not math.isfinite(epsilon) or epsilon <= 0.0:
        return 0.0
    return epsilon if budget is None else min(epsilon, budget)
