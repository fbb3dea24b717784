"""Properties of the Rényi filter, of curve arithmetic and of the remaining-budget view."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    ORDERS,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PrivacyEventError,
    PureDPEvent,
    ZCDPEvent,
    add_curves,
    admission_order,
    calibrate_noise_multiplier,
    capacity_curve,
    ledger_epsilon,
    rdp_curve,
    remaining_epsilon,
    subtract_curves,
)
from privtrain_common.directed_rounding import format_remaining

N = len(ORDERS)
ZEROS = (0.0,) * N

curves = st.lists(st.floats(min_value=0.0, max_value=50.0), min_size=N, max_size=N).map(tuple)
jobs = st.one_of(
    st.builds(GaussianEvent, st.floats(0.5, 50.0), st.integers(1, 20)),
    st.builds(ZCDPEvent, st.floats(1e-4, 0.5), st.integers(1, 5)),
    st.builds(PureDPEvent, st.floats(1e-3, 2.0), st.integers(1, 5)),
    st.builds(LaplaceEvent, st.floats(0.5, 20.0), st.integers(1, 5)),
    st.builds(PoissonSampledGaussianEvent, st.floats(1e-3, 0.2), st.floats(0.6, 5.0), st.integers(1, 200)),
)
budgets = st.tuples(st.floats(0.5, 16.0), st.sampled_from([1e-5, 1e-7, 1e-3]))


@given(budgets, st.lists(st.tuples(jobs, st.booleans()), min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_admitted_jobs_never_overspend(budget: tuple[float, float], submitted: list[tuple[PrivacyEvent, bool]]) -> None:
    epsilon, delta = budget
    capacity = capacity_curve(epsilon, delta)
    committed, reserved = ZEROS, ZEROS
    for job, as_reservation in submitted:
        cost = rdp_curve(job)
        witness = admission_order(committed=committed, reserved=reserved, cost=cost, capacity=capacity)
        if witness is None:
            continue  # a rejected job changes nothing
        before = ledger_epsilon(add_curves(committed, reserved), delta)
        if as_reservation:
            reserved = add_curves(reserved, cost)
        else:
            committed = add_curves(committed, cost)
        used = add_curves(committed, reserved)
        assert used[witness] <= capacity[witness]
        assert ledger_epsilon(used, delta) >= before  # spending never goes down
    # The filter's promise: what was admitted, together, is within the budget.
    assert ledger_epsilon(add_curves(committed, reserved), delta) <= epsilon * (1 + 1e-10)


@given(curves, curves, curves, curves)
@settings(max_examples=300, deadline=None)
def test_admission_is_sound_in_exact_arithmetic(
    committed: tuple[float, ...], reserved: tuple[float, ...], cost: tuple[float, ...], capacity: tuple[float, ...]
) -> None:
    witness = admission_order(committed=committed, reserved=reserved, cost=cost, capacity=capacity)
    exact_fits = [
        Fraction(c) + Fraction(r) + Fraction(x) <= Fraction(k)
        for c, r, x, k in zip(committed, reserved, cost, capacity, strict=True)
    ]
    # Fits with a margin larger than the outward rounding (relative 1e-12, plus an absolute one
    # for subnormals, where a relative margin vanishes): such an order must be found.
    comfortably = [
        (c + r + x) * (1 + 1e-10) + 1e-300 <= k for c, r, x, k in zip(committed, reserved, cost, capacity, strict=True)
    ]
    if witness is not None:
        assert exact_fits[witness]
        assert not any(comfortably[:witness])  # it is the FIRST order that fits
    else:
        assert not any(comfortably)


@given(curves, curves)
@settings(max_examples=300, deadline=None)
def test_add_then_subtract_restores_and_never_undershoots(
    used: tuple[float, ...], reservation: tuple[float, ...]
) -> None:
    total = add_curves(used, reservation)
    back = subtract_curves(total, reservation)
    for u, r, t, b in zip(used, reservation, total, back, strict=True):
        assert Fraction(t) >= Fraction(u) + Fraction(r)  # sums round up
        assert b >= u  # a release never frees more than was reserved
        assert b <= u + 1e-10 * (u + r) + 1e-300
    assert subtract_curves(reservation, add_curves(reservation, used)) == ZEROS  # over-release clamps
    assert all(v == 0.0 for v in subtract_curves(ZEROS, reservation))  # clamped at zero


@given(curves, curves)
@settings(max_examples=300, deadline=None)
def test_subtract_is_the_tightest_float_not_below_the_exact_difference(
    a: tuple[float, ...], b: tuple[float, ...]
) -> None:
    for x, y, d in zip(a, b, subtract_curves(a, b), strict=True):
        exact = max(Fraction(0), Fraction(x) - Fraction(y))
        assert Fraction(d) >= exact
        assert d == 0.0 or Fraction(math.nextafter(d, -math.inf)) < exact


def test_exactly_equal_curves_subtract_to_exact_zero() -> None:
    curve = rdp_curve(PoissonSampledGaussianEvent(0.01, 1.0, 10))
    assert subtract_curves(curve, curve) == ZEROS


@given(
    st.integers(0, N - 1),
    st.sampled_from([math.nan, math.inf, -math.inf, -1e-300, -1.0]),
    st.sampled_from(["cost", "committed", "reserved", "capacity"]),
)
@settings(max_examples=60, deadline=None)
def test_nan_inf_and_negative_values_are_refused(index: int, bad: float, which: str) -> None:
    curves_in = {"committed": ZEROS, "reserved": ZEROS, "cost": (0.1,) * N, "capacity": (1.0,) * N}
    broken = list(curves_in[which])
    broken[index] = bad
    curves_in[which] = tuple(broken)
    with pytest.raises(PrivacyEventError):
        admission_order(**curves_in)


@pytest.mark.parametrize("length", [0, N - 1, N + 1])
def test_wrong_lengths_are_refused(length: int) -> None:
    with pytest.raises(PrivacyEventError):
        admission_order(committed=ZEROS, reserved=ZEROS, cost=(0.1,) * length, capacity=(1.0,) * N)
    with pytest.raises(PrivacyEventError):
        add_curves(ZEROS, (0.1,) * length)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0, 8.0, 30.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_remaining_epsilon_of_a_fresh_ledger_is_the_budget(epsilon: float, delta: float) -> None:
    remaining = remaining_epsilon(used=ZEROS, capacity=capacity_curve(epsilon, delta), delta=delta)
    assert remaining <= epsilon
    assert remaining == pytest.approx(epsilon, rel=1e-6)
    # told the budget, an untouched one is exactly it (not 7.999… for 8), printed as it was set
    exact = remaining_epsilon(used=ZEROS, capacity=capacity_curve(epsilon, delta), delta=delta, budget_epsilon=epsilon)
    assert exact == epsilon
    assert format_remaining(exact) == format_remaining(epsilon) == f"{epsilon:g}"


def test_remaining_epsilon_refuses_a_capacity_of_another_budget() -> None:
    with pytest.raises(PrivacyEventError, match="capacity"):
        remaining_epsilon(used=ZEROS, capacity=capacity_curve(8.0, 1e-5), delta=1e-5, budget_epsilon=9.0)


sigma_shaped_jobs = st.one_of(
    st.tuples(st.just("gaussian"), st.floats(0.0, 0.0), st.integers(1, 20)),
    st.tuples(st.just("subsampled"), st.floats(1e-3, 0.2), st.integers(1, 400)),
)


def _job_at(shape: tuple[str, float, int]) -> Callable[[float], PrivacyEvent]:
    kind, q, count = shape
    if kind == "gaussian":
        return lambda sigma: GaussianEvent(sigma, count)
    return lambda sigma: PoissonSampledGaussianEvent(q, sigma, count)


@given(budgets, sigma_shaped_jobs)
@settings(max_examples=40, deadline=None)
def test_a_job_priced_at_an_untouched_budgets_remaining_epsilon_is_admitted(
    budget: tuple[float, float], shape: tuple[str, float, int]
) -> None:
    """Admission is the source of truth: the exact ε_G shown on an untouched budget (and the
    figure printed for it, rounded down) admits a job of any shape calibrated to it."""
    epsilon, delta = budget
    capacity = capacity_curve(epsilon, delta)
    remaining = remaining_epsilon(used=ZEROS, capacity=capacity, delta=delta, budget_epsilon=epsilon)
    assert remaining == epsilon
    for target in {remaining, float(format_remaining(remaining))}:
        build = _job_at(shape)
        sigma = calibrate_noise_multiplier(build, target_epsilon=target, delta=delta)
        cost = rdp_curve(build(sigma))
        assert admission_order(committed=ZEROS, reserved=ZEROS, cost=cost, capacity=capacity) is not None


@given(budgets, st.lists(jobs, min_size=1, max_size=6), st.booleans())
@settings(max_examples=40, deadline=None)
def test_the_remaining_epsilon_shown_never_exceeds_the_budget_and_admits_a_gaussian_priced_at_it(
    budget: tuple[float, float], submitted: list[PrivacyEvent], as_reservations: bool
) -> None:
    """Whatever is committed or reserved, the figure is at most ε_G, and a Gaussian calibrated to
    it (or to its printed, rounded-down form) is admitted by the filter itself."""
    epsilon, delta = budget
    capacity = capacity_curve(epsilon, delta)
    committed, reserved = ZEROS, ZEROS
    for job in submitted:
        cost = rdp_curve(job)
        if admission_order(committed=committed, reserved=reserved, cost=cost, capacity=capacity) is None:
            continue
        if as_reservations:
            reserved = add_curves(reserved, cost)
        else:
            committed = add_curves(committed, cost)
    used = add_curves(committed, reserved)
    remaining = remaining_epsilon(used=used, capacity=capacity, delta=delta, budget_epsilon=epsilon)
    assert 0.0 <= remaining <= epsilon
    if remaining < 1e-3:
        return  # no meaningful Gaussian left to calibrate
    for target in {remaining, float(format_remaining(remaining))}:
        fits = _gaussian_for(target, delta)
        assert admission_order(committed=committed, reserved=reserved, cost=fits, capacity=capacity) is not None


@given(budgets, st.lists(jobs, min_size=1, max_size=8))
@settings(max_examples=40, deadline=None)
def test_remaining_epsilon_decreases_as_jobs_are_added(
    budget: tuple[float, float], submitted: list[PrivacyEvent]
) -> None:
    epsilon, delta = budget
    capacity = capacity_curve(epsilon, delta)
    used = ZEROS
    remaining = remaining_epsilon(used=used, capacity=capacity, delta=delta)
    for job in submitted:
        cost = rdp_curve(job)
        if admission_order(committed=used, reserved=ZEROS, cost=cost, capacity=capacity) is None:
            continue
        used = add_curves(used, cost)
        now = remaining_epsilon(used=used, capacity=capacity, delta=delta)
        assert 0.0 <= now <= remaining
        remaining = now


def _gaussian_for(epsilon: float, delta: float) -> tuple[float, ...]:
    sigma = calibrate_noise_multiplier(lambda s: GaussianEvent(s, 1), target_epsilon=epsilon, delta=delta)
    return rdp_curve(GaussianEvent(sigma, 1))


@pytest.mark.parametrize(
    ("budget", "spent_by"),
    [
        ((8.0, 1e-5), [PoissonSampledGaussianEvent(256 / 60000, 1.0, 2000)]),
        ((8.0, 1e-5), [GaussianEvent(3.0, 1), ZCDPEvent(0.05, 3)]),
        ((2.0, 1e-7), [LaplaceEvent(4.0, 1)]),
        ((1.0, 1e-5), []),
    ],
)
def test_remaining_epsilon_is_what_a_gaussian_job_could_still_get(
    budget: tuple[float, float], spent_by: list[PrivacyEvent]
) -> None:
    epsilon, delta = budget
    capacity = capacity_curve(epsilon, delta)
    used = ZEROS
    for job in spent_by:
        used = add_curves(used, rdp_curve(job))
    remaining = remaining_epsilon(used=used, capacity=capacity, delta=delta)
    assert 0.0 < remaining <= epsilon
    fits = _gaussian_for(remaining, delta)
    assert admission_order(committed=used, reserved=ZEROS, cost=fits, capacity=capacity) is not None
    too_much = _gaussian_for(remaining * (1 + 1e-4), delta)
    assert admission_order(committed=used, reserved=ZEROS, cost=too_much, capacity=capacity) is None


def test_remaining_epsilon_is_zero_when_nothing_fits() -> None:
    capacity = capacity_curve(1.0, 1e-5)
    assert remaining_epsilon(used=capacity, capacity=capacity, delta=1e-5) == 0.0
    over = tuple(c + 1.0 for c in capacity)
    assert remaining_epsilon(used=over, capacity=capacity, delta=1e-5) == 0.0


def test_filter_witness_is_an_order_index() -> None:
    capacity = capacity_curve(8.0, 1e-5)
    witness = admission_order(committed=ZEROS, reserved=ZEROS, cost=rdp_curve(GaussianEvent(2.0, 1)), capacity=capacity)
    assert witness is not None and 0 <= witness < N
