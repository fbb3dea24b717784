"""A job's run of the shared DP-SGD loop (dp/loop/batch_loop.py), for every trainer built on it:
dp-sgd and the baselines (a per-sample map), dc-dpsgd and dicesgd (their own aggregators).

The loop gets the job's charged σ, q and steps straight from the request, the public expected
batch size B as the normaliser, and an aggregator whose sensitivity is the one the catalogue
charged: the noise drawn per step is N(0, σ²Δ² I) on the sum. On a dataset with a privacy unit
column the loop samples units, and each unit's gradient is the mean over its
``training.rows_per_unit`` row slots, bounded as one (dp/loop/units.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from algorithms.registry import H, PoissonGaussianAlgorithm
from algorithms.trainers import TrainingRequest
from algorithms.training_fields import learning_rate_of
from dp.loop.augmult import with_augmult
from dp.loop.batch_loop import DPSGDConfig, per_sample_map_aggregator, train_dp_sgd
from dp.loop.state import TrainingHooks, TrainingResult
from dp.loop.units import unit_sampling
from dp.per_example.aggregator import BatchAggregator
from dp.per_example.per_sample import PerSampleMap

__all__ = ["OptimizerChoice", "loop_config", "run_loop", "run_with_per_sample_map"]


@dataclass(frozen=True)
class OptimizerChoice:
    """How the released gradient is applied: post-processing, no privacy effect."""

    name: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


def loop_config(request: TrainingRequest[Any], *, sensitivity: float, optimizer: OptimizerChoice) -> DPSGDConfig:
    """The loop's configuration: the charged σ, q, steps and B of the request. ``sensitivity`` is
    the aggregator's, recorded as the clipping norm (with an aggregator the loop reads it from the
    aggregator; here it documents the noise scale σ·Δ)."""
    return DPSGDConfig(
        steps=request.steps,
        sampling_probability=request.sampling_probability,
        noise_multiplier=request.noise_multiplier,
        clipping_norm=sensitivity,
        learning_rate=learning_rate_of(request.training),
        momentum=optimizer.momentum,
        weight_decay=optimizer.weight_decay,
        loss=request.loss,
        max_physical_batch_size=request.max_physical_batch_size,
        optimizer=optimizer.name,
        adam_betas=optimizer.betas,
        adam_eps=optimizer.eps,
        expected_batch_size=request.expected_batch_size,
    )


def run_loop(
    request: TrainingRequest[Any],
    aggregator: BatchAggregator,
    *,
    optimizer: OptimizerChoice,
    hooks: TrainingHooks | None = None,
) -> TrainingResult:
    """The loop on the request's rows (or units) with ``aggregator``; ``hooks`` default to the request's."""
    loop_aggregator, units = unit_sampling(aggregator, request.units, rows_per_unit=request.training.rows_per_unit)
    return train_dp_sgd(
        request.model,
        request.features,
        request.y,
        config=loop_config(request, sensitivity=aggregator.sensitivity, optimizer=optimizer),
        generator=request.generator,
        hooks=hooks if hooks is not None else request.hooks,
        resume_from=request.resume_from,
        device=request.device,
        aggregator=loop_aggregator,
        units=units,
    )


def run_with_per_sample_map(
    algorithm: PoissonGaussianAlgorithm[H],
    request: TrainingRequest[H],
    per_sample_map: PerSampleMap,
    *,
    optimizer: OptimizerChoice,
) -> TrainingResult:
    """The trainer of every per-sample-map algorithm (dp-sgd, dp-adam, auto-s, dp-psac). The map's
    bound S must equal the sensitivity the catalogue charged. With ``training.augmult`` = K each
    sampled image's per-sample gradient is the mean over K augmented views (dp/loop/augmult.py),
    mapped as one row: S, and so the charge, does not depend on K."""
    charged = algorithm.sensitivity(request.hyperparameters)
    if per_sample_map.norm_bound != charged:
        raise RuntimeError(f"{algorithm.name}: the per-sample map's bound differs from the charged sensitivity")
    aggregator = with_augmult(
        per_sample_map_aggregator(request.model, per_sample_map, precision=request.training.precision or "fp32"),
        request.training.augmult,
    )
    return run_loop(request, aggregator, optimizer=optimizer)
