"""Trainers of the heavy-tailed DP-SCO family (app/algorithms/ht_dpsco.py).

The job's charged σ is the only privacy input: ε_step = 1/σ for the exponential mechanisms,
Laplace scale b = σ·λ for Peeling. Every other parameter is re-derived by the catalogue entry
that priced the job from the same public facts (the training-row count the API assumed is
``expected_batch_size × steps`` for the block algorithms, ``expected_batch_size`` for Alg 2), and
the worker's normaliser and sensitivity come from that one resolution, so they are consistent
with each other by construction. The result is written into the catalogue's linear model
(``linear-regression``: weight w; ``logistic-regression`` with two classes: logits ±w/2, so
P(class 1) = σ(⟨w, x⟩)), biases 0, and saved like any model.

No checkpoints: the loops are single pass and short; a retried attempt restarts from scratch
inside the same reservation (only one output is ever released).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from app.algorithms import get_algorithm
from app.algorithms.ht_dpsco import (
    FWHyperparameters,
    FWResolved,
    LassoResolved,
    SparseLinRegResolved,
    SparseOptHyperparameters,
    SparseOptResolved,
)
from app.facts import DatasetFacts
from app.schemas.jobs import TrainingSpec
from worker.optimizers.ht_algorithms import (
    FWConfig,
    LassoConfig,
    LoopOutcome,
    RowAccess,
    SparseLinRegConfig,
    SparseOptConfig,
    run_ht_frank_wolfe,
    run_ht_private_lasso,
    run_ht_sparse_linreg,
    run_ht_sparse_opt,
)
from worker.optimizers.ht_mechanisms import Polytope
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_preflight, register_trainer

HT_ALGORITHMS = ("ht-dp-fw", "ht-private-lasso", "ht-sparse-linreg", "ht-sparse-opt")


def linear_layer(model: nn.Module) -> nn.Linear:
    """The single nn.Linear of the catalogue's linear-regression / logistic-regression models."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if len(layers) != 1 or any(isinstance(m, (nn.Conv2d, nn.GroupNorm)) for m in model.modules()):
        raise ValueError("the heavy-tailed family trains linear models only (linear-regression, logistic-regression)")
    layer = layers[0]
    if layer.out_features not in (1, 2):
        raise ValueError("the heavy-tailed family needs one output (regression) or two classes")
    return layer


def _preflight(model: nn.Module, _spec: dict[str, Any]) -> None:
    linear_layer(model)


for _name in HT_ALGORITHMS:
    register_preflight(_name)(_preflight)


def write_weights(model: nn.Module, w: torch.Tensor) -> None:
    """Regression: weight = w. Two classes: logits (−⟨w,x⟩/2, ⟨w,x⟩/2), so their difference is ⟨w,x⟩."""
    layer = linear_layer(model)
    w = w.to(device=layer.weight.device, dtype=layer.weight.dtype)
    with torch.no_grad():
        if layer.out_features == 1:
            layer.weight.copy_(w[None, :])
        else:
            layer.weight.copy_(torch.stack([-0.5 * w, 0.5 * w]))
        if layer.bias is not None:
            layer.bias.zero_()


@dataclass(frozen=True)
class _Job:
    resolved: Any
    hyperparameters: Any
    data: RowAccess


def _prepare(name: str, request: TrainingRequest, *, full_batch: bool) -> _Job:
    algorithm = get_algorithm(name)
    hyper = algorithm.validate_hyperparameters(request.spec["algorithm"]["hyperparameters"])
    training = TrainingSpec.model_validate(request.spec["training"])
    training_rows = request.expected_batch_size * (1 if full_batch else request.steps)
    layer = linear_layer(request.model)
    classification = request.task == "classification"
    facts = DatasetFacts(
        n_rows=math.ceil(training_rows), feature_shape=(layer.in_features,), task=request.task,
        n_classes=layer.out_features if classification else None,
    )
    resolved = algorithm.resolve(hyper, training=training, training_rows=training_rows, facts=facts)  # type: ignore[attr-defined]
    if resolved.iterations != request.steps:
        raise RuntimeError(f"{name}: the re-derived T differs from the charged number of steps")
    X = request.X.reshape(request.X.shape[0], -1).to(device=request.device, dtype=torch.float64)
    y = request.y.to(device=request.device, dtype=torch.float64)
    if classification:
        y = 2.0 * y - 1.0  # class indices {0, 1} → labels {−1, +1}
    return _Job(resolved=resolved, hyperparameters=hyper, data=RowAccess(X, y))


def _finish(request: TrainingRequest, outcome: LoopOutcome) -> TrainingResult:
    if not outcome.stopped_early:
        write_weights(request.model, outcome.weights)
    return TrainingResult(steps_run=outcome.steps_run, stopped_early=outcome.stopped_early)


@register_trainer("ht-dp-fw")
def run_ht_dp_fw(request: TrainingRequest) -> TrainingResult:
    job = _prepare("ht-dp-fw", request, full_batch=False)
    r, h = job.resolved, job.hyperparameters
    assert isinstance(r, FWResolved) and isinstance(h, FWHyperparameters)
    config = FWConfig(
        polytope=Polytope(h.constraint, h.radius, job.data.dim), iterations=r.iterations, block_size=r.block_size,
        kappa=r.kappa, beta=r.beta, loss=r.loss, epsilon_step=1.0 / request.noise_multiplier,
        score_sensitivity=r.score_sensitivity, constant_step=r.constant_step, biweight_c=h.biweight_c,
        selection=h.selection,
    )
    return _finish(request, run_ht_frank_wolfe(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer("ht-private-lasso")
def run_ht_private_lasso_job(request: TrainingRequest) -> TrainingResult:
    job = _prepare("ht-private-lasso", request, full_batch=True)
    r = job.resolved
    assert isinstance(r, LassoResolved)
    config = LassoConfig(
        polytope=Polytope("l1_ball", r.radius, job.data.dim), iterations=r.iterations, normaliser=r.training_rows,
        truncation=r.truncation, epsilon_step=1.0 / request.noise_multiplier, score_sensitivity=r.score_sensitivity,
    )
    return _finish(request, run_ht_private_lasso(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer("ht-sparse-linreg")
def run_ht_sparse_linreg_job(request: TrainingRequest) -> TrainingResult:
    job = _prepare("ht-sparse-linreg", request, full_batch=False)
    r = job.resolved
    assert isinstance(r, SparseLinRegResolved)
    config = SparseLinRegConfig(
        iterations=r.iterations, block_size=r.block_size, sparsity=r.sparsity, truncation=r.truncation,
        step=r.step, radius=r.radius, laplace_scale=request.noise_multiplier * r.sensitivity,
        sensitivity=r.sensitivity,
    )
    return _finish(request, run_ht_sparse_linreg(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer("ht-sparse-opt")
def run_ht_sparse_opt_job(request: TrainingRequest) -> TrainingResult:
    job = _prepare("ht-sparse-opt", request, full_batch=False)
    r, h = job.resolved, job.hyperparameters
    assert isinstance(r, SparseOptResolved) and isinstance(h, SparseOptHyperparameters)
    config = SparseOptConfig(
        iterations=r.iterations, block_size=r.block_size, sparsity=r.sparsity, scale=r.scale, beta=r.beta,
        step=r.step, loss=r.loss, laplace_scale=request.noise_multiplier * r.sensitivity,
        sensitivity=r.sensitivity,
        l2=h.l2_regularisation if r.loss == "logistic" else 0.0,
        regulariser_in_estimator=h.regulariser_in_estimator,
    )
    return _finish(request, run_ht_sparse_opt(job.data, config, generator=request.generator, hooks=request.hooks))
