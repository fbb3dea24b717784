"""The estimate's expected interval of a DP metric, computed before anything is spent, is the
interval the release will give: checked against simulated releases (the hold-out size drawn as the
per-row coins draw it, the noise as the mechanism draws it) through the same interval code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernel.jobs.evaluation import EvaluationPlan, expected_interval, metric_interval


def _plan(
    *,
    mechanism: str = "laplace",
    noise_multiplier: float = 2.0,
    fraction: float = 0.2,
    n: int = 1000,
    metric: str = "accuracy",
    sensitivity: float = 1.0,
) -> EvaluationPlan:
    return EvaluationPlan(
        holdout_fraction=fraction,
        mechanism=mechanism,
        metric=metric,
        sensitivity=sensitivity,
        noise_multiplier=noise_multiplier,
        expected_holdout_rows=fraction * n,
        n_rows=n,
    )


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_the_expected_width_is_the_width_releases_give(mechanism: str) -> None:
    plan = _plan(mechanism=mechanism)
    expected = expected_interval(plan)
    rng = np.random.default_rng(0)
    widths = []
    for _ in range(400):
        rows = rng.binomial(plan.n_rows, plan.holdout_fraction)
        noise = rng.laplace(0.0, plan.noise_scale) if mechanism == "laplace" else rng.normal(0.0, plan.noise_scale)
        released = metric_interval(
            plan,
            noisy_sum=0.5 * rows + noise,
            noise_half_width_on_sum=expected["noise_half_width"] * plan.expected_holdout_rows,
        )
        widths.append(released.high - released.low)
    assert float(np.mean(widths)) == pytest.approx(expected["width"], rel=0.05)
    assert expected["low"] < 0.5 < expected["high"] and f"width {expected['width']:.3g}" in expected["statement"]


def test_the_noise_half_width_is_the_mechanisms_tail_and_shrinks_with_epsilon_and_holdout() -> None:
    plan = _plan(noise_multiplier=0.5)  # Laplace at ε = 2: b = 0.5 on the count
    interval = expected_interval(plan)
    assert interval["noise_half_width"] == pytest.approx(0.5 * math.log(40) / 200)  # P(|L| > w) = 2.5%
    wider_epsilon = expected_interval(_plan(noise_multiplier=0.25))
    larger_holdout = expected_interval(_plan(noise_multiplier=0.5, fraction=0.4))
    assert wider_epsilon["width"] < interval["width"] and larger_holdout["width"] < interval["width"]


def test_perplexity_states_the_factor_the_noise_spans() -> None:
    plan = _plan(metric="perplexity", sensitivity=11.1, noise_multiplier=1.0, fraction=0.1, n=1500)
    interval = expected_interval(plan)
    loss = 11.1 * math.log(40) / 150
    assert interval["noise_half_width_on_mean_token_loss"] == pytest.approx(loss)
    assert interval["perplexity_factor"] == pytest.approx(math.exp(loss)) and "factor" in interval["statement"]
