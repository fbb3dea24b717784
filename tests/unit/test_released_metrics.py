"""Released DP metrics: clamped to their valid range whatever the noise (post-processing, free),
with the noise scale on the metric and a 95% interval for the true hold-out value computed from
public quantities only; the interval's tails are those of the mechanism actually used."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp.randomness import discrete_samplers
from dp.randomness.secure_random import SecureRandom
from kernel.datasets.facts import DatasetFacts
from kernel.jobs.evaluation import (
    CONFIDENCE,
    EvaluationPlan,
    gaussian_half_width,
    holdout_size_bounds,
    plan_evaluation,
    released_metric,
)
from kernel.schemas.jobs import EvaluationSpec
from worker import evaluation

CLASSIFICATION = DatasetFacts(n_rows=300, feature_shape=(4,), task="classification", n_classes=2)
REGRESSION = DatasetFacts(n_rows=500, feature_shape=(3,), task="regression", n_classes=None)


def _laplace_accuracy(epsilon: float = 0.5) -> EvaluationPlan:
    return plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=epsilon), CLASSIFICATION)


def _gaussian_mse() -> EvaluationPlan:
    return plan_evaluation(
        EvaluationSpec(holdout_fraction=0.1, mechanism="gaussian", noise_multiplier=3.0, error_clip=4.0), REGRESSION
    )


def _release(plan: EvaluationPlan, noisy_sum: float) -> dict:
    half_width = evaluation.NOISE_TAILS[plan.mechanism].half_width(plan, plan.noise_scale, (1 - CONFIDENCE) / 2)
    return released_metric(
        plan,
        noisy_sum=noisy_sum,
        noise_half_width_on_sum=half_width,
        noise_distribution=evaluation.NOISE_TAILS[plan.mechanism].distribution,
    )


noisy_sums = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.sampled_from([-math.inf, math.inf, -(2.0**1000), 2.0**1000, 0.0, 60.0, 67.38]),
)


@given(noisy=noisy_sums, accuracy=st.booleans())
@settings(max_examples=300, deadline=None)
def test_whatever_the_noise_the_released_value_and_its_interval_lie_in_range(noisy: float, accuracy: bool) -> None:
    plan = _laplace_accuracy() if accuracy else _gaussian_mse()
    released = _release(plan, noisy)
    low, high = released["valid_range"]
    assert (low, high) == ((0.0, 1.0) if accuracy else (0.0, 4.0))
    value = released[plan.metric]
    interval = released["interval"]
    assert low <= interval["low"] <= value <= interval["high"] <= high
    assert released["clamped"] == (value != noisy / plan.expected_holdout_rows)
    assert released["noise_scale"] == plan.noise_scale / plan.expected_holdout_rows
    assert interval["confidence"] == CONFIDENCE and "public quantities only" in interval["covers"]


def test_the_reported_accuracy_of_1_123_becomes_1() -> None:
    plan = _laplace_accuracy()
    released = _release(plan, 1.123 * plan.expected_holdout_rows)
    assert released["accuracy"] == 1.0 and released["clamped"] is True
    assert released["interval"]["high"] == 1.0 and released["interval"]["low"] < 1.0


def test_gaussian_half_width_is_the_normal_quantile() -> None:
    assert gaussian_half_width(std=2.0, alpha=0.05) == pytest.approx(2.0 * 1.959963984540054, rel=1e-12)


@pytest.mark.parametrize("grid_bits", [0, 2, 6, 40])
def test_snapped_laplace_half_width_bounds_the_exact_tail(grid_bits: int) -> None:
    """P(|γZ + rounding| > w) ≤ P(|Z| ≥ k) with k = ⌊(w - γ/2)/γ⌋ + 1, exactly 2pᵏ/(1 + p)."""
    for scale, alpha in ((2.0, 0.025), (0.7, 0.01), (40.0, 0.05)):
        p = discrete_samplers.snapped_laplace_parameters(
            scale=scale, l1_sensitivity=1.0, dimension=1, grid_bits=grid_bits
        )
        w = discrete_samplers.snapped_laplace_half_width(grid=p.grid, noise_units=p.noise_units, alpha=alpha)
        k = math.floor((w - p.grid / 2) / p.grid) + 1
        log_tail = math.log(2) - k / p.noise_units - math.log1p(math.exp(-1.0 / p.noise_units))
        assert log_tail <= math.log(alpha)
        if grid_bits == 40:  # fine grid: the continuous Laplace b·ln(1/alpha), b = tγ
            assert w == pytest.approx(p.noise_units * p.grid * math.log(1 / alpha), rel=1e-6)


def test_snapped_laplace_tail_matches_samples_on_a_coarse_grid() -> None:
    """One value at a time (the release is one value): the snap's rounding plus γ·DLap(t)."""
    p = discrete_samplers.snapped_laplace_parameters(scale=2.0, l1_sensitivity=1.0, dimension=1, grid_bits=2)
    w = discrete_samplers.snapped_laplace_half_width(grid=p.grid, noise_units=p.noise_units, alpha=0.05)
    rng = np.random.default_rng(0)
    sampled = [
        discrete_samplers.snapped_laplace(rng, np.array([0.3]), scale=2.0, l1_sensitivity=1.0, grid_bits=2)[0] - 0.3
        for _ in range(20_000)
    ]
    assert np.mean(np.abs(sampled) > w) <= 0.05
    assert np.mean(np.abs(sampled) > 0.8 * w) > 0.05  # and not wildly loose


def test_holdout_size_bounds_hold_with_the_stated_probability() -> None:
    for n, f, alpha in ((300, 0.2, 0.025), (10_000, 0.05, 0.025), (20, 0.5, 0.1)):
        low, high = holdout_size_bounds(n_rows=n, fraction=f, alpha=alpha)
        covered = stats.binom.cdf(high, n, f) - stats.binom.cdf(low - 1, n, f)
        assert covered >= 1 - alpha and low <= n * f <= high


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_the_interval_covers_the_true_holdout_accuracy(mechanism: str) -> None:
    """Simulate the whole release: per-row coins, a model with true accuracy 0.9 on the hold-out,
    the worker's own noise; the true value S/|H| lies in the interval at least 95% of the time."""
    spec = (
        EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=0.5)
        if mechanism == "laplace"
        else EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", noise_multiplier=2.0)
    )
    plan = plan_evaluation(spec, CLASSIFICATION)
    coins = np.random.default_rng(1)
    random = SecureRandom.from_seed(2)
    misses = 0
    trials = 400
    for _ in range(trials):
        held = int((coins.random(CLASSIFICATION.n_rows) < plan.holdout_fraction).sum())
        correct = int(coins.binomial(held, 0.9))
        released = _release(plan, evaluation.noisy_sum(plan, float(correct), random))
        truth = correct / held
        misses += not released["interval"]["low"] <= truth <= released["interval"]["high"]
    assert misses / trials <= 1 - CONFIDENCE


def test_the_worker_releases_a_clamped_metric_with_its_interval_and_noise_scale() -> None:
    """A perfect model and a tiny ε: the noisy accuracy often leaves [0, 1]; what is released never does."""
    plan = _laplace_accuracy(epsilon=0.05)
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        model.bias.zero_()
    X = torch.eye(2).repeat(30, 1)
    y = torch.tensor([0, 1] * 30)
    values = []
    for _ in range(40):
        released = evaluation.release(model, X, y, plan)
        assert 0.0 <= released["accuracy"] <= 1.0
        assert released["interval"]["low"] <= released["accuracy"] <= released["interval"]["high"]
        assert released["noise_scale"] == pytest.approx(20.0 / 60.0)
        assert released["mechanism"] == "laplace" and "snapped Laplace" in released["noise_distribution"]
        values.append(released["accuracy"])
    assert 1.0 in values  # the noise pushed some above 1: they were clamped
