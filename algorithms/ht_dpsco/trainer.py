"""Trainers of the heavy-tailed DP-SCO family (algorithms/ht_dpsco/definition.py).

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
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from algorithms.ht_dpsco.calibration import PHI_BOUND
from algorithms.ht_dpsco.definition import HTDPFrankWolfe, HTPrivateLasso, HTSparseLinReg, HTSparseOpt
from algorithms.ht_dpsco.family import HTAlgorithm
from algorithms.ht_dpsco.hyperparameters import (
    FWHyperparameters,
    HTHyperparameters,
    LassoHyperparameters,
    SparseLinRegHyperparameters,
    SparseOptHyperparameters,
)
from algorithms.ht_dpsco.loops import (
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
from algorithms.ht_dpsco.mechanisms import Polytope
from algorithms.registry import definition_of
from algorithms.trainers import TrainingRequest, register_preflight, register_trainer
from dp.data.rows import materialise
from dp.loop.state import TrainingResult
from kernel.datasets.facts import DatasetFacts

HT_ALGORITHMS: tuple[type[HTAlgorithm[Any, Any]], ...] = (HTDPFrankWolfe, HTPrivateLasso, HTSparseLinReg, HTSparseOpt)


class _Resolved(Protocol):
    @property
    def iterations(self) -> int: ...


R = TypeVar("R", bound=_Resolved)
H = TypeVar("H", bound=HTHyperparameters)


def linear_layer(model: nn.Module) -> nn.Linear:
    """The single nn.Linear of the catalogue's linear-regression / logistic-regression models."""
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if len(layers) != 1 or any(isinstance(m, (nn.Conv2d, nn.GroupNorm)) for m in model.modules()):
        raise ValueError("the heavy-tailed family trains linear models only (linear-regression, logistic-regression)")
    layer = layers[0]
    if layer.out_features not in (1, 2):
        raise ValueError("the heavy-tailed family needs one output (regression) or two classes")
    return layer


def _preflight(model: nn.Module, _hyperparameters: object) -> None:
    linear_layer(model)


for _algorithm in HT_ALGORITHMS:
    register_preflight(_algorithm)(_preflight)


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
class _Job(Generic[R]):
    resolved: R
    data: RowAccess


def _prepare(algorithm: HTAlgorithm[H, R], request: TrainingRequest[H]) -> _Job[R]:
    """Re-resolve the run's public constants from the job's validated hyperparameters and
    training spec, and refuse to run if they would not be the charged T."""
    name = algorithm.name
    training_rows = request.expected_batch_size * (1 if algorithm.full_batch else request.steps)
    layer = linear_layer(request.model)
    classification = request.task == "classification"
    facts = DatasetFacts(
        n_rows=math.ceil(training_rows),
        feature_shape=(layer.in_features,),
        task=request.task,
        n_classes=layer.out_features if classification else None,
    )
    resolved = algorithm.resolve(
        request.hyperparameters, training=request.training, training_rows=training_rows, facts=facts
    )
    if resolved.iterations != request.steps:
        raise RuntimeError(f"{name}: the re-derived T differs from the charged number of steps")
    features = materialise(request.features)
    X = features.reshape(features.shape[0], -1).to(device=request.device, dtype=torch.float64)
    y = request.y.to(device=request.device, dtype=torch.float64)
    if classification:
        y = 2.0 * y - 1.0  # class indices {0, 1} → labels {−1, +1}
    return _Job(resolved=resolved, data=RowAccess(X, y))


def _finish(request: TrainingRequest[Any], outcome: LoopOutcome) -> TrainingResult:
    if not outcome.stopped_early:
        write_weights(request.model, outcome.weights)
    return TrainingResult(steps_run=outcome.steps_run, stopped_early=outcome.stopped_early)


@register_trainer(HTDPFrankWolfe)
def run_ht_dp_fw(request: TrainingRequest[FWHyperparameters]) -> TrainingResult:
    job = _prepare(definition_of(HTDPFrankWolfe), request)
    r, h = job.resolved, request.hyperparameters
    config = FWConfig(
        polytope=Polytope(h.constraint, h.radius, job.data.dim),
        iterations=r.iterations,
        block_size=r.block_size,
        kappa=r.kappa,
        beta=r.beta,
        loss=r.loss,
        epsilon_step=1.0 / request.noise_multiplier,
        score_sensitivity=r.score_sensitivity,
        term_bound=PHI_BOUND,
        constant_step=r.constant_step,
        biweight_c=h.biweight_c,
        selection=h.selection,
    )
    return _finish(request, run_ht_frank_wolfe(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer(HTPrivateLasso)
def run_ht_private_lasso_job(request: TrainingRequest[LassoHyperparameters]) -> TrainingResult:
    job = _prepare(definition_of(HTPrivateLasso), request)
    r = job.resolved
    config = LassoConfig(
        polytope=Polytope("l1_ball", r.radius, job.data.dim),
        iterations=r.iterations,
        normaliser=r.training_rows,
        truncation=r.truncation,
        epsilon_step=1.0 / request.noise_multiplier,
        score_sensitivity=r.score_sensitivity,
    )
    return _finish(request, run_ht_private_lasso(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer(HTSparseLinReg)
def run_ht_sparse_linreg_job(request: TrainingRequest[SparseLinRegHyperparameters]) -> TrainingResult:
    job = _prepare(definition_of(HTSparseLinReg), request)
    r = job.resolved
    config = SparseLinRegConfig(
        iterations=r.iterations,
        block_size=r.block_size,
        sparsity=r.sparsity,
        truncation=r.truncation,
        step=r.step,
        radius=r.radius,
        laplace_scale=request.noise_multiplier * r.sensitivity,
        sensitivity=r.sensitivity,
    )
    return _finish(request, run_ht_sparse_linreg(job.data, config, generator=request.generator, hooks=request.hooks))


@register_trainer(HTSparseOpt)
def run_ht_sparse_opt_job(request: TrainingRequest[SparseOptHyperparameters]) -> TrainingResult:
    job = _prepare(definition_of(HTSparseOpt), request)
    r, h = job.resolved, request.hyperparameters
    config = SparseOptConfig(
        iterations=r.iterations,
        block_size=r.block_size,
        sparsity=r.sparsity,
        scale=r.scale,
        beta=r.beta,
        step=r.step,
        loss=r.loss,
        laplace_scale=request.noise_multiplier * r.sensitivity,
        sensitivity=r.sensitivity,
        term_bound=PHI_BOUND,
        l2=h.l2_regularisation if r.loss == "logistic" else 0.0,
        regulariser_in_estimator=h.regulariser_in_estimator,
    )
    return _finish(request, run_ht_sparse_opt(job.data, config, generator=request.generator, hooks=request.hooks))
