"""The bounded searches behind an estimate's choices: most steps at a σ, least σ at some steps,
and the remaining ε after one more job. Each answer is checked against the filter itself."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    ORDERS,
    GaussianEvent,
    PoissonSampledGaussianEvent,
    add_curves,
    capacity_curve,
    rdp_curve,
    remaining_epsilon,
)
from kernel.privacy.admissible import (
    SIGMA_RELATIVE_TOLERANCE,
    FilterState,
    largest_admissible_steps,
    linear_steps_guess,
    sigma_probe_limit,
    smallest_admissible_noise_multiplier,
    steps_probe_limit,
)
from kernel.privacy.orders import Curve

N = len(ORDERS)
ZEROS: Curve = (0.0,) * N
DELTA = 1e-5


def _counted(cost: Callable[[int], Curve | None]) -> tuple[Callable[[int], Curve | None], list[int]]:
    probes: list[int] = []

    def counting(value: int) -> Curve | None:
        probes.append(value)
        return cost(value)

    return counting, probes


def _state(*, budget_epsilon: float, used_by: Curve = ZEROS) -> FilterState:
    return FilterState(committed=used_by, reserved=ZEROS, capacity=capacity_curve(budget_epsilon, DELTA))


def _threshold_state(largest: float) -> FilterState:
    """A filter that admits a cost (T, T, …) iff T <= ``largest`` (capacity halfway to the next)."""
    return FilterState(committed=ZEROS, reserved=ZEROS, capacity=(largest + 0.5,) * N)


# --- steps: exact on any monotone cost, and bounded -------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    max_steps=st.integers(1, 2_000_000),
    largest=st.integers(0, 2_000_000),
    guess=st.one_of(st.none(), st.integers(-10, 3_000_000)),
)
def test_steps_search_is_exact_and_bounded_for_any_threshold_and_guess(
    max_steps: int, largest: int, guess: int | None
) -> None:
    cost, probes = _counted(lambda steps: (float(steps),) * N)
    found = largest_admissible_steps(
        cost_of_steps=cost, state=_threshold_state(largest), max_steps=max_steps, guess=guess
    )
    assert found == (None if largest < 1 else min(largest, max_steps))
    assert len(probes) <= steps_probe_limit(max_steps)
    assert all(1 <= probe <= max_steps for probe in probes)


def test_a_cost_too_large_to_compute_counts_as_refused() -> None:
    state = _threshold_state(1e9)
    found = largest_admissible_steps(
        cost_of_steps=lambda steps: None if steps > 70 else (float(steps),) * N, state=state, max_steps=1000
    )
    assert found == 70


@settings(max_examples=25, deadline=None)
@given(
    q=st.floats(1e-3, 0.5),
    sigma=st.floats(0.6, 8.0),
    budget=st.floats(0.2, 10.0),
    used_steps=st.integers(0, 300),
)
def test_largest_steps_fit_and_one_more_does_not(q: float, sigma: float, budget: float, used_steps: int) -> None:
    """DP-SGD's event at a fixed σ, against budgets already partly used by another such job."""

    def cost(steps: int) -> Curve:
        return rdp_curve(PoissonSampledGaussianEvent(sampling_probability=q, noise_multiplier=sigma, count=steps))

    state = _state(budget_epsilon=budget, used_by=cost(used_steps))
    max_steps = 1_000_000
    counting, probes = _counted(cost)
    guess = linear_steps_guess(cost_without_steps=ZEROS, cost_at=cost(100), steps=100, state=state)
    found = largest_admissible_steps(cost_of_steps=counting, state=state, max_steps=max_steps, guess=guess)
    assert len(probes) <= steps_probe_limit(max_steps)
    if found is None:
        assert not state.admits(cost(1))
        return
    assert state.admits(cost(found))
    assert found == max_steps or not state.admits(cost(found + 1))


def test_the_linear_guess_lands_next_to_the_answer() -> None:
    """A good guess is what keeps the search to a few probes (3 here instead of ~40)."""

    def cost(steps: int) -> Curve:
        return rdp_curve(PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=1.0, count=steps))

    state = _state(budget_epsilon=3.0)
    guess = linear_steps_guess(cost_without_steps=ZEROS, cost_at=cost(1000), steps=1000, state=state)
    counting, probes = _counted(cost)
    found = largest_admissible_steps(cost_of_steps=counting, state=state, max_steps=10**6, guess=guess)
    assert found is not None and abs(found - guess) <= 2
    assert len(probes) <= 4


# --- σ: admitted side, within the tolerance, bounded -------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    q=st.floats(1e-3, 1.0),
    steps=st.integers(1, 2000),
    budget=st.floats(0.1, 20.0),
    used_sigma=st.one_of(st.none(), st.floats(1.0, 20.0)),
)
def test_smallest_sigma_fits_and_a_slightly_smaller_one_does_not(
    q: float, steps: int, budget: float, used_sigma: float | None
) -> None:
    def cost(sigma: float) -> Curve:
        if q == 1.0:
            return rdp_curve(GaussianEvent(noise_multiplier=sigma, count=steps))
        return rdp_curve(PoissonSampledGaussianEvent(sampling_probability=q, noise_multiplier=sigma, count=steps))

    used = ZEROS if used_sigma is None else rdp_curve(GaussianEvent(noise_multiplier=used_sigma, count=1))
    state = _state(budget_epsilon=budget, used_by=used)
    low, high = 1e-3, 1e5
    probes: list[float] = []

    def counting(sigma: float) -> Curve:
        probes.append(sigma)
        return cost(sigma)

    found = smallest_admissible_noise_multiplier(cost_of_sigma=counting, state=state, low=low, high=high)
    assert len(probes) <= sigma_probe_limit(low=low, high=high)
    if found is None:
        assert not state.admits(cost(high))
        return
    assert low <= found <= high and state.admits(cost(found))
    if found > low:
        assert not state.admits(cost(found / (1.0 + 2 * SIGMA_RELATIVE_TOLERANCE)))


def test_sigma_search_ends_at_the_bounds() -> None:
    def cost(sigma: float) -> Curve:
        return rdp_curve(GaussianEvent(noise_multiplier=sigma, count=1))

    assert (
        smallest_admissible_noise_multiplier(cost_of_sigma=cost, state=_state(budget_epsilon=50.0), low=5.0, high=10.0)
        == 5.0
    )
    assert (
        smallest_admissible_noise_multiplier(cost_of_sigma=cost, state=_state(budget_epsilon=0.01), low=0.1, high=1.0)
        is None
    )
    with pytest.raises(ValueError):
        smallest_admissible_noise_multiplier(cost_of_sigma=cost, state=_state(budget_epsilon=1.0), low=2.0, high=1.0)


# --- remaining after one more job ---------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.5, 20.0), steps=st.integers(1, 50), committed_sigma=st.floats(1.0, 30.0))
def test_remaining_after_is_the_ledgers_remaining_once_the_job_is_reserved(
    sigma: float, steps: int, committed_sigma: float
) -> None:
    cost = rdp_curve(GaussianEvent(noise_multiplier=sigma, count=steps))
    committed = rdp_curve(GaussianEvent(noise_multiplier=committed_sigma, count=1))
    reserved = rdp_curve(GaussianEvent(noise_multiplier=committed_sigma * 2, count=1))
    state = FilterState(committed=committed, reserved=reserved, capacity=capacity_curve(8.0, DELTA))
    after = state.remaining_epsilon_after(cost, delta=DELTA)
    if not state.admits(cost):
        assert after is None
        return
    # what kernel.ledger.operations does: reserve (reserved + cost), then remaining over committed + reserved
    expected = remaining_epsilon(
        used=add_curves(committed, add_curves(reserved, cost)), capacity=state.capacity, delta=DELTA
    )
    assert after == expected
    assert after <= remaining_epsilon(used=add_curves(committed, reserved), capacity=state.capacity, delta=DELTA)


def test_probe_limits_are_logarithmic() -> None:
    assert steps_probe_limit(1_000_000) == 2 * math.ceil(math.log2(1_000_000)) + 2
    assert sigma_probe_limit(low=1e-4, high=1e6) <= 27
