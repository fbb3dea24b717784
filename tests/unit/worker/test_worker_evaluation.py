"""DP evaluation: the worker's noise is the charged noise; the split and the release are as priced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats

from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.jobs.evaluation import InvalidEvaluation, plan_evaluation
from kernel.schemas.jobs import EvaluationSpec
from worker import evaluation

CLASSIFICATION = DatasetFacts(n_rows=1000, feature_shape=(3,), task="classification", n_classes=2)
REGRESSION = DatasetFacts(n_rows=1000, feature_shape=(3,), task="regression", n_classes=None)


def test_laplace_noise_matches_the_charged_event() -> None:
    plan = plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=0.5), CLASSIFICATION)
    assert plan.event() == privacy.LaplaceEvent(noise_multiplier=2.0, count=1)
    rng = SecureRandom.from_seed(0)
    draws = np.array([evaluation.noisy_sum(plan, 0.0, rng) for _ in range(20_000)])
    # Laplace(b = sensitivity / ε = 2): KS test against the charged distribution
    assert stats.kstest(draws, stats.laplace(scale=2.0).cdf).pvalue > 1e-3
    # the released sums lie on one power-of-two grid whatever the true sum (no Mironov leak)
    grid = 2.0 ** (1 - 40)
    for raw in (0.0, 150.0, 1.0 / 3.0):
        assert all(evaluation.noisy_sum(plan, raw, rng) % grid == 0.0 for _ in range(200))
    assert plan.normalise(noisy_sum=150.0) == pytest.approx(150.0 / 200.0)


def test_gaussian_noise_matches_the_charged_event_for_regression() -> None:
    plan = plan_evaluation(
        EvaluationSpec(holdout_fraction=0.1, mechanism="gaussian", noise_multiplier=3.0, error_clip=4.0), REGRESSION
    )
    assert plan.sensitivity == 4.0 and plan.noise_scale == 12.0
    assert plan.event() == privacy.GaussianEvent(noise_multiplier=3.0, count=1)
    for secure in (False, True):
        rng = SecureRandom.from_seed(1, secure_gaussian=secure)
        draws = np.array([evaluation.noisy_sum(plan, 0.0, rng) for _ in range(20_000)])
        assert stats.kstest(draws, stats.norm(scale=12.0).cdf).pvalue > 1e-3


def test_invalid_evaluations() -> None:
    with pytest.raises(InvalidEvaluation):
        plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=1.0), REGRESSION)
    with pytest.raises(InvalidEvaluation):
        plan_evaluation(
            EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=1.0, error_clip=1.0), CLASSIFICATION
        )
    with pytest.raises(ValueError):
        EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", epsilon=1.0)


def test_holdout_is_per_row_and_survives_retries(tmp_path: Path) -> None:
    path = tmp_path / "job.holdout.npy"
    first = evaluation.load_or_draw_holdout(path, 10_000, 0.2)
    assert abs(first.mean() - 0.2) < 0.03
    assert np.array_equal(evaluation.load_or_draw_holdout(path, 10_000, 0.2), first)
    other = evaluation.load_or_draw_holdout(tmp_path / "other.npy", 10_000, 0.2)
    assert not np.array_equal(other, first)  # fresh CSPRNG randomness per job


def test_metric_sum_has_the_declared_sensitivity() -> None:
    """Adding one held-out row changes the released sum by at most the sensitivity."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 1))
    plan = plan_evaluation(
        EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", noise_multiplier=1.0, error_clip=2.0), REGRESSION
    )
    X, y = torch.randn(50, 3), torch.randn(50) * 100  # huge errors get clipped
    base = evaluation.metric_sum(model, X, y, plan)
    for _ in range(5):
        x_new, y_new = torch.randn(1, 3) * 10, torch.randn(1) * 1e6
        more = evaluation.metric_sum(model, torch.cat([X, x_new]), torch.cat([y, y_new]), plan)
        assert 0 <= more - base <= plan.sensitivity + 1e-9
