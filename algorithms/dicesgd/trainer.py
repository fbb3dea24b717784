"""The dicesgd trainers: the job's charged σ, q, steps and public B go into the DP-SGD loop with
DiceSGD's error-feedback aggregator (algorithms.dicesgd.aggregator).

The aggregator's sum-scale sensitivity C1 + 2·B·C2 must equal the catalogue's
``PrivacyPlan.sensitivity`` for the same hyperparameters and B (both come from
``sound_average_sensitivity``), so the noise drawn is σ·(C1/B + 2·C2) on the average — the
charged GaussianEvent. The error-feedback vector e is checkpointed with the private training
state and restored on resume; it is never logged or reported.
"""

from __future__ import annotations

from typing import Any

from algorithms.dicesgd.aggregator import (
    ErrorFeedbackAggregator,
    ErrorFeedbackClip,
    ErrorFeedbackNormalise,
    train_dicesgd,
)
from algorithms.dicesgd.definition import (
    DiceSGD,
    DiceSGDAdam,
    DiceSGDAdamHyperparameters,
    DiceSGDAuto,
    DiceSGDAutoHyperparameters,
    DiceSGDHyperparameters,
    sound_average_sensitivity,
)
from algorithms.dp_sgd_loop import OptimizerChoice, loop_config
from algorithms.trainers import TrainingRequest, register_trainer
from dp.loop.state import TrainingResult
from dp.per_example.per_sample import AbadiClip
from dp.per_example.per_sample_maps import AutoSClip


def _run(
    request: TrainingRequest[Any], aggregator: ErrorFeedbackAggregator, optimizer: OptimizerChoice
) -> TrainingResult:
    bounds_avg = sound_average_sensitivity(
        c1=aggregator.per_sample_map.norm_bound,
        c2=aggregator.feedback_map.norm_bound,
        expected_batch_size=request.expected_batch_size,
    )
    charged_sum = bounds_avg * request.expected_batch_size
    if abs(aggregator.sensitivity - charged_sum) > 1e-12 * charged_sum:
        raise RuntimeError("dicesgd: the aggregator's sensitivity differs from the charged one")
    return train_dicesgd(
        request.model,
        request.features,
        request.y,
        config=loop_config(request, sensitivity=aggregator.sensitivity, optimizer=optimizer),
        aggregator=aggregator,
        generator=request.generator,
        hooks=request.hooks,
        resume_from=request.resume_from,
        device=request.device,
        units=request.units,
        rows_per_unit=request.training.rows_per_unit,
    )


def _clipping(c1: float, c2: float, request: TrainingRequest[Any]) -> ErrorFeedbackAggregator:
    """Algorithm 2's maps: clip(g, C1) per sample, clip(e, C2) on the feedback."""
    return ErrorFeedbackAggregator(
        per_sample_map=AbadiClip(c1),
        feedback_map=ErrorFeedbackClip(c2),
        expected_batch_size=request.expected_batch_size,
    )


@register_trainer(DiceSGD)
def run_dicesgd(request: TrainingRequest[DiceSGDHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    optimizer = OptimizerChoice("sgd", hyper.momentum, hyper.weight_decay)
    return _run(request, _clipping(hyper.c1, hyper.c2, request), optimizer)


@register_trainer(DiceSGDAdam)
def run_dicesgd_adam(request: TrainingRequest[DiceSGDAdamHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    betas = (hyper.beta1, hyper.beta2)
    optimizer = OptimizerChoice("adam", weight_decay=hyper.weight_decay, betas=betas, eps=hyper.eps)
    return _run(request, _clipping(hyper.c1, hyper.c2, request), optimizer)


@register_trainer(DiceSGDAuto)
def run_dicesgd_auto(request: TrainingRequest[DiceSGDAutoHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    aggregator = ErrorFeedbackAggregator(
        per_sample_map=AutoSClip(clipping_norm=1.0, gamma=hyper.gamma),
        feedback_map=ErrorFeedbackNormalise(hyper.gamma),
        expected_batch_size=request.expected_batch_size,
    )
    return _run(request, aggregator, OptimizerChoice("sgd", hyper.momentum, hyper.weight_decay))
