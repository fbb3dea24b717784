"""Run one heavy-tailed DP-SCO job the way the service does, minus HTTP and the database.

The catalogue entry plans the job from public facts, σ is calibrated against the target ε with
the ledger's own calibration (``kernel.privacy.calibrate_noise_multiplier``), and the registered
worker trainer runs it and writes the linear model; the weights are read back from that model.
The non-private counterpart is the same loop with the noise removed (ε → ∞) and no
truncation (κ, K → ∞).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algorithms import get_algorithm
from algorithms.ht_dpsco import loops
from algorithms.ht_dpsco.calibration import PHI_BOUND
from algorithms.ht_dpsco.mechanisms import Polytope
from algorithms.ht_dpsco.trainer import linear_layer
from algorithms.trainers import TrainingRequest, get_trainer
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.schemas.jobs import TrainingSpec
from privtrain_common.zoo.architectures import build_model

__all__ = ["PrivateRun", "non_private_fw", "non_private_iht", "run_private"]


@dataclass(frozen=True)
class PrivateRun:
    weights: np.ndarray
    noise_multiplier: float
    epsilon_ledger: float
    steps: int
    seconds: float


def run_private(
    name: str,
    hyperparameters: dict[str, Any],
    X: np.ndarray,
    y: np.ndarray,
    *,
    task: str,
    target_epsilon: float,
    delta: float,
    seed: int,
    steps: int | None = None,
) -> PrivateRun:
    """Plan, calibrate and train like a job; ``y`` holds class indices {0, 1} for classification."""
    n, d = X.shape
    classes = 2 if task == "classification" else None
    facts = DatasetFacts(n_rows=n, feature_shape=(d,), task=task, n_classes=classes)
    algorithm = get_algorithm(name)
    training = algorithm.accept_training(TrainingSpec(steps=steps, epochs=None if steps else 1), facts)
    hyper = algorithm.validate_hyperparameters(hyperparameters)
    plan = algorithm.plan(hyper, training, facts)
    sigma = privacy.calibrate_noise_multiplier(
        lambda s: plan.event_for(s, plan.steps), target_epsilon=target_epsilon, delta=delta
    )
    epsilon = privacy.RdpAccountant().compose(plan.event_for(sigma, plan.steps)).epsilon(delta)
    model = build_model(
        "linear-regression" if classes is None else "logistic-regression", {}, input_shape=(d,), n_outputs=classes or 1
    )
    request = TrainingRequest(
        model=model,
        X=torch.from_numpy(X),
        y=torch.from_numpy(y),
        task=task,
        hyperparameters=hyper,
        training=training,
        noise_multiplier=sigma,
        sampling_probability=plan.sampling_probability,
        expected_batch_size=plan.expected_batch_size,
        steps=plan.steps,
        max_physical_batch_size=1024,
        generator=SecureRandom.from_seed(seed),
        hooks=TrainingHooks(),
        resume_from=None,
        device=torch.device("cpu"),
    )
    start = time.perf_counter()
    get_trainer(name)(request)
    seconds = time.perf_counter() - start
    layer = linear_layer(model)
    weight = layer.weight.detach().double()
    w = weight[0] if layer.out_features == 1 else weight[1] - weight[0]
    return PrivateRun(
        weights=w.numpy().copy(), noise_multiplier=sigma, epsilon_ledger=epsilon, steps=plan.steps, seconds=seconds
    )


class NonPrivate:
    """The non-private reference's "mechanisms": exact argmax, values unchanged (bench only)."""

    def select_exponential(self, scores: torch.Tensor, *, epsilon: float, sensitivity: float) -> int:
        return int(torch.argmax(scores))

    def report_noisy_max(self, scores: torch.Tensor, *, scale: float, sensitivity: float) -> int:
        return int(torch.argmax(scores))

    def laplace_release(self, values: torch.Tensor, *, scale: float, sensitivity: float) -> torch.Tensor:
        return values.to(torch.float64).clone()


def non_private_fw(
    X: np.ndarray,
    y: np.ndarray,
    *,
    iterations: int,
    loss: str,
    radius: float = 1.0,
    constraint: str = "l1_ball",
    seed: int = 0,
) -> np.ndarray:
    """Plain stochastic FW on the same kind of disjoint blocks: mean gradient, best vertex."""
    data = loops.RowAccess(torch.from_numpy(X), torch.from_numpy(y))
    config = loops.FWConfig(
        polytope=Polytope(constraint, radius, X.shape[1]),  # type: ignore[arg-type]
        iterations=iterations,
        block_size=X.shape[0] / iterations,
        kappa=1e15,
        beta=1.0,
        loss=loss,
        epsilon_step=1.0,
        score_sensitivity=1.0,
        term_bound=PHI_BOUND,
    )
    return loops.run_ht_frank_wolfe(
        data, config, generator=SecureRandom.from_seed(seed), hooks=TrainingHooks(), noise=NonPrivate()
    ).weights.numpy()


def non_private_iht(
    X: np.ndarray, y: np.ndarray, *, iterations: int, sparsity: int, step: float, radius: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Plain IHT on disjoint blocks: no truncation, exact top-s, projection onto the ℓ2 ball."""
    data = loops.RowAccess(torch.from_numpy(X), torch.from_numpy(y))
    config = loops.SparseLinRegConfig(
        iterations=iterations,
        block_size=X.shape[0] / iterations,
        sparsity=sparsity,
        truncation=1e300,
        step=step,
        radius=radius,
        laplace_scale=1.0,
        sensitivity=1.0,
    )
    return loops.run_ht_sparse_linreg(
        data, config, generator=SecureRandom.from_seed(seed), hooks=TrainingHooks(), noise=NonPrivate()
    ).weights.numpy()
