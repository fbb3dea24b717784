"""The noise the worker's dp-sgd trainer really draws equals the noise the API charged.

Plans a job with the API's own code (target ε → σ, q, T, event), runs the registered worker
trainer with those exact job fields on data whose weight gradients are exactly zero, and recovers
the noise from the parameter change: Δw = −lr · Σ_t noise_t / (q·n), each coordinate
N(0, T·(σ·C)²)·lr/(q·n).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

N_ROWS, N_FEATURES = 2000, 1500


@pytest.mark.parametrize(
    "evaluation",
    [None, {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.2}],
    ids=["all-rows", "with-holdout"],
)
def test_dp_sgd_trainer_draws_the_charged_noise(evaluation: dict | None) -> None:
    """With a hold-out, the normaliser must be the public B, not q·(rows passed to the trainer)."""
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[N_FEATURES], task="classification", n_classes=2)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 0.7}},
            "privacy": {"target_epsilon": 2.0},
            "training": {"steps": 20, "batch_size": 100, "learning_rate": 0.5},
            "evaluation": evaluation,
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    event = privacy.event_from_json(plan.event_json)
    if evaluation is not None:
        assert isinstance(event, privacy.ComposedEvent)
        event, eval_event = event.events
        assert eval_event == privacy.LaplaceEvent(noise_multiplier=5.0, count=1)
    assert isinstance(event, privacy.PoissonSampledGaussianEvent)
    assert event.noise_multiplier == plan.noise_multiplier and event.count == 20
    assert plan.plan.expected_batch_size == 100

    model = build_model(
        "logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=torch.Generator().manual_seed(0)
    )
    before = model[-1].weight.detach().clone()
    X = torch.zeros(N_ROWS, N_FEATURES)  # zero inputs: every weight gradient is exactly zero
    y = torch.randint(0, 2, (N_ROWS,))
    result = get_trainer("dp-sgd")(
        TrainingRequest(
            model=model,
            features=TensorRows(X),
            y=y,
            task="classification",
            hyperparameters=plan.hyperparameters,
            training=plan.training,
            noise_multiplier=plan.noise_multiplier,
            sampling_probability=plan.plan.sampling_probability,
            expected_batch_size=plan.plan.expected_batch_size,
            steps=plan.plan.steps,
            max_physical_batch_size=64,
            generator=SecureRandom.from_seed(1),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
        )
    )
    assert result.steps_run == 20
    after = model[-1].weight.detach()
    change = (after - before).flatten().double().numpy()
    expected_std = 0.5 * math.sqrt(20) * plan.noise_std_on_sum / 100  # lr·√T·σC / B
    observed_std = float(change.std())
    assert observed_std == pytest.approx(expected_std, rel=0.05)
    # two-sided χ² test of the variance with known mean 0
    statistic = float(np.sum((change / expected_std) ** 2))
    p_value = 2 * min(stats.chi2.cdf(statistic, change.size), stats.chi2.sf(statistic, change.size))
    assert p_value > 1e-3
    assert abs(float(change.mean())) < 4 * expected_std / math.sqrt(change.size)
