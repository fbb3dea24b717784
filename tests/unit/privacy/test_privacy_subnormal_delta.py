"""Every δ-derived number is total on 0 < δ < 1, subnormals included, and conservative.

New budgets and jobs are held to δ ≥ 1e-30 at the API edge, but rows written before that hold
δ = 5e-324, whose δ/|ORDERS| underflowed to 0 (log(0) then failed every ledger page). The
conversion now works in log δ: these properties say the answers are finite, never smaller than
the exact ones (40-digit reference), and monotone — a smaller δ never buys a smaller ε.
"""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    ORDERS,
    GaussianEvent,
    PoissonSampledGaussianEvent,
    PureDPEvent,
    capacity_curve,
    capped_single_job_epsilon,
    epsilon_from_rdp,
    ledger_epsilon,
    prv_epsilon,
    rdp_curve,
    remaining_epsilon,
    single_job_epsilon,
)
from kernel.privacy.conversion import per_order_log_delta
from kernel.privacy.single_job import (
    gaussian_dp_epsilon,
    pure_dp_composition_epsilon,
    rdp_single_job_epsilon,
)

SUBNORMAL = 5e-324
TINY_DELTAS = [SUBNORMAL, 1e-320, 2.2e-308, 1e-307, 1e-300, 1e-31]
DELTAS = st.one_of(st.sampled_from(TINY_DELTAS), st.floats(SUBNORMAL, 1.0, exclude_max=True))
EPSILONS = st.floats(1e-3, 100.0)
ROUNDING = 1e-12
"""Monotone up to float rounding: two δ straddling the normal/subnormal edge of δ/|ORDERS| take
the quotient's log on one side and a difference of logs on the other, equal to ~1e-13."""
CURVE_EVENTS = st.builds(
    PoissonSampledGaussianEvent,
    st.floats(1e-4, 1.0),
    st.floats(0.3, 50.0),
    st.integers(1, 10_000),
)


def _exact_epsilon(mp: object, rdp: float, order: float, delta: float) -> object:
    """ε at one order in 40 digits, at the ledger's δ/|ORDERS|."""
    a = mp.mpf(order)  # type: ignore[attr-defined]
    log_share = mp.log(mp.mpf(delta)) - mp.log(len(ORDERS))  # type: ignore[attr-defined]
    return mp.mpf(rdp) + mp.log1p(-1 / a) - (log_share + mp.log(a)) / (a - 1)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(delta=DELTAS)
def test_per_order_log_delta_is_finite_and_accurate(delta: float) -> None:
    value = per_order_log_delta(delta)
    assert math.isfinite(value)
    assert value == pytest.approx(math.log(delta) - math.log(len(ORDERS)), rel=1e-14)


def test_per_order_log_delta_is_bit_identical_for_every_delta_the_api_ever_accepted() -> None:
    for delta in (1e-30, 1e-12, 1e-5, 0.5, 0.999):
        assert per_order_log_delta(delta) == math.log(delta / len(ORDERS))
    assert SUBNORMAL / len(ORDERS) == 0.0  # what the old code took the log of
    assert per_order_log_delta(sys.float_info.min * 2) < per_order_log_delta(sys.float_info.min * 40)


@settings(max_examples=150, deadline=None)
@given(event=CURVE_EVENTS, delta=DELTAS, smaller=st.floats(0.0, 1.0))
def test_ledger_epsilon_is_finite_and_monotone_in_delta(
    event: PoissonSampledGaussianEvent, delta: float, smaller: float
) -> None:
    curve = rdp_curve(event)
    lower_delta = max(SUBNORMAL, delta * smaller)
    epsilon = ledger_epsilon(curve, delta)
    assert math.isfinite(epsilon) and epsilon >= 0
    assert ledger_epsilon(curve, lower_delta) >= epsilon * (1 - ROUNDING)
    single, _ = epsilon_from_rdp(curve, delta)
    assert math.isfinite(single) and single <= epsilon  # the ledger pays δ/|ORDERS|: never less


@settings(max_examples=150, deadline=None)
@given(epsilon=EPSILONS, delta=DELTAS, smaller=st.floats(0.0, 1.0))
def test_capacity_is_finite_and_shrinks_with_delta(epsilon: float, delta: float, smaller: float) -> None:
    capacity = capacity_curve(epsilon, delta)
    assert all(math.isfinite(c) and c >= 0.0 for c in capacity)
    lower = capacity_curve(epsilon, max(SUBNORMAL, delta * smaller))
    assert all(low <= high + ROUNDING * epsilon for low, high in zip(lower, capacity, strict=True))


@settings(max_examples=150, deadline=None)
@given(epsilon=EPSILONS, delta=DELTAS, event=CURVE_EVENTS)
def test_remaining_epsilon_is_finite_and_within_the_budget(
    epsilon: float, delta: float, event: PoissonSampledGaussianEvent
) -> None:
    capacity = capacity_curve(epsilon, delta)
    used = tuple(min(c, u) for c, u in zip(capacity, rdp_curve(event), strict=True))
    remaining = remaining_epsilon(used=used, capacity=capacity, delta=delta)
    assert math.isfinite(remaining) and 0.0 <= remaining <= epsilon


@pytest.mark.parametrize("delta", TINY_DELTAS)
@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_tiny_delta_conversion_is_on_the_safe_side_in_40_digits(delta: float, epsilon: float) -> None:
    mp = pytest.importorskip("mpmath")
    with mp.workdps(40):
        for order, value in zip(ORDERS, capacity_curve(epsilon, delta), strict=True):
            if value > 0.0:
                exact = _exact_epsilon(mp, value, order, delta)
                assert exact <= epsilon  # a capacity never converts to more than the budget
                assert exact >= epsilon * (1 - 1e-10)  # ...and is tight
        curve = rdp_curve(PoissonSampledGaussianEvent(0.01, 1.0, 1000))
        reported = ledger_epsilon(curve, delta)
        exact_best = min(_exact_epsilon(mp, r, a, delta) for r, a in zip(curve, ORDERS, strict=True))
        assert exact_best <= reported <= exact_best * (1 + 1e-10)


def test_subnormal_golden_values() -> None:
    """Hand-checkable: ρ-zCDP curve ρa at δ = 5e-324, order 256 wins."""
    curve = tuple(0.01 * a for a in ORDERS)
    expected = min(
        0.01 * a + math.log1p(-1 / a) - (math.log(SUBNORMAL) - math.log(20) + math.log(a)) / (a - 1) for a in ORDERS
    )
    assert ledger_epsilon(curve, SUBNORMAL) == pytest.approx(expected, rel=1e-10)
    assert ledger_epsilon(curve, SUBNORMAL) >= expected
    by_hand = 8.0 - math.log1p(-1 / 256) + (math.log(SUBNORMAL) - math.log(20) + math.log(256)) / 255
    assert by_hand == pytest.approx(5.0945388924566, rel=1e-12)
    assert capacity_curve(8.0, SUBNORMAL)[-1] == pytest.approx(by_hand, rel=1e-10)
    assert capacity_curve(8.0, SUBNORMAL)[-1] <= by_hand


@settings(max_examples=40, deadline=None)
@given(delta=DELTAS, mu=st.floats(1e-3, 30.0))
def test_gaussian_dp_epsilon_is_finite_and_monotone(delta: float, mu: float) -> None:
    epsilon = gaussian_dp_epsilon(mu=mu, delta=delta)
    assert math.isfinite(epsilon) and epsilon >= 0
    assert gaussian_dp_epsilon(mu=mu, delta=max(SUBNORMAL, delta / 1e6)) >= epsilon * (1 - ROUNDING)


@settings(max_examples=20, deadline=None)
@given(delta=DELTAS, epsilon0=st.floats(1e-3, 5.0), count=st.integers(1, 200))
def test_pure_dp_and_rdp_single_job_are_finite(delta: float, epsilon0: float, count: int) -> None:
    event = PureDPEvent(epsilon0, count)
    optimal = pure_dp_composition_epsilon(epsilon0=epsilon0, count=count, delta=delta)
    assert math.isfinite(optimal) and 0 <= optimal <= epsilon0 * count * (1 + 1e-9)
    rdp = rdp_single_job_epsilon(event, delta)
    assert math.isfinite(rdp) and rdp >= 0


@pytest.mark.parametrize(
    "event", [GaussianEvent(1.0, 10), PoissonSampledGaussianEvent(0.01, 1.0, 100), PureDPEvent(0.5, 10)]
)
def test_single_job_epsilon_at_a_subnormal_delta_uses_closed_forms_only(event: object) -> None:
    """Below 1e-30 prv-accountant is not trusted (its δ error underflows): no child process is
    started, the answer is a finite closed form, no larger than the ledger's number."""
    closed = single_job_epsilon(event, SUBNORMAL, zcdp_is_gaussian=False, numeric=True)  # type: ignore[arg-type]
    assert math.isfinite(closed.epsilon) and closed.method not in {"prv", "pld"}
    assert closed.epsilon <= ledger_epsilon(rdp_curve(event), SUBNORMAL)  # type: ignore[arg-type]
    capped = capped_single_job_epsilon(event, SUBNORMAL, zcdp_is_gaussian=False, timeout_s=1e-6)  # type: ignore[arg-type]
    assert capped == closed  # no "numeric accountant not available": none was tried
    assert prv_epsilon(event, 1e-31) is None  # type: ignore[arg-type]
