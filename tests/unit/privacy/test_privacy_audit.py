"""The one-run audit bound (Steinke, Nasr, Jagielski 2023): closed forms, monotonicity, validity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy.audit import one_run_epsilon_lower_bound, one_run_p_value


def test_all_correct_with_no_delta_has_a_closed_form() -> None:
    """δ = 0, v = r: p = q^r, so ε_lb solves q^r = 0.05, q = e^ε/(1 + e^ε)."""
    for r in (10, 100, 1000, 20_000):
        q = 0.05 ** (1 / r)
        expected = math.log(q / (1 - q))
        assert one_run_epsilon_lower_bound(canaries=r, guesses=r, correct=r, delta=0.0) == pytest.approx(
            expected, abs=1e-7
        )
    assert one_run_epsilon_lower_bound(canaries=1000, guesses=1000, correct=1000, delta=0.0) == pytest.approx(
        5.8090683, abs=1e-6
    )


def test_p_value_at_zero_epsilon_is_a_fair_coin_tail() -> None:
    from scipy import stats

    assert one_run_p_value(canaries=50, guesses=40, correct=30, epsilon=0.0, delta=0.0) == pytest.approx(
        float(stats.binom.sf(29, 40, 0.5)), rel=1e-12
    )


def test_delta_term_caps_what_one_run_can_certify() -> None:
    """With δ = 1e-5 even perfect guessing certifies only about ε = 8: the 2mδ term dominates."""
    perfect = one_run_epsilon_lower_bound(canaries=32_000, guesses=25_600, correct=25_600, delta=1e-5)
    assert 8.0 < perfect < 8.1
    assert one_run_epsilon_lower_bound(canaries=32_000, guesses=25_600, correct=25_600, delta=0.0) > 8.3


def test_chance_level_guessing_certifies_nothing() -> None:
    assert one_run_epsilon_lower_bound(canaries=1000, guesses=500, correct=250, delta=1e-5) == 0.0
    assert one_run_epsilon_lower_bound(canaries=10, guesses=0, correct=0, delta=1e-5) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    guesses=st.integers(min_value=1, max_value=400),
    data=st.data(),
    delta=st.sampled_from([0.0, 1e-6, 1e-3]),
)
def test_bound_grows_with_correct_guesses_and_shrinks_with_delta(
    guesses: int, data: st.DataObject, delta: float
) -> None:
    correct = data.draw(st.integers(min_value=0, max_value=guesses - 1))
    canaries = guesses + data.draw(st.integers(min_value=0, max_value=100))
    lower = one_run_epsilon_lower_bound(canaries=canaries, guesses=guesses, correct=correct, delta=delta)
    higher = one_run_epsilon_lower_bound(canaries=canaries, guesses=guesses, correct=correct + 1, delta=delta)
    assert higher >= lower - 1e-9
    looser = one_run_epsilon_lower_bound(
        canaries=canaries, guesses=guesses, correct=correct + 1, delta=min(1.0, 10 * delta + 1e-4)
    )
    assert looser <= higher + 1e-9


@pytest.mark.parametrize("true_epsilon", [0.5, 2.0])
def test_the_bound_is_valid_for_epsilon_dp_randomized_response(true_epsilon: float) -> None:
    """Guesses from ε-DP randomized response (the optimal guesser against an ε-DP mechanism):
    the 95% bound exceeds the true ε in at most ~5% of runs (binomial slack: ≤ 12/100)."""
    rng = np.random.default_rng(7)
    q = 1 / (1 + math.exp(-true_epsilon))
    guesses, exceed = 300, 0
    for _ in range(100):
        correct = int(rng.binomial(guesses, q))
        exceed += (
            one_run_epsilon_lower_bound(canaries=guesses, guesses=guesses, correct=correct, delta=0.0) > true_epsilon
        )
    assert exceed <= 12
    # ... and the bound is not vacuous: on average it is a sizeable fraction of the truth.
    typical = one_run_epsilon_lower_bound(canaries=guesses, guesses=guesses, correct=round(q * guesses), delta=0.0)
    assert typical > 0.4 * true_epsilon


def test_invalid_counts_are_refused() -> None:
    for canaries, guesses, correct in ((10, 11, 0), (10, 5, 6), (10, 5, -1)):
        with pytest.raises(ValueError):
            one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=1.0, delta=0.0)
    with pytest.raises(ValueError):
        one_run_p_value(canaries=10, guesses=5, correct=5, epsilon=-1.0, delta=0.0)
    with pytest.raises(ValueError):
        one_run_epsilon_lower_bound(canaries=10, guesses=5, correct=5, delta=0.0, confidence=1.0)
