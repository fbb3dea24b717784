"""Trainers of the DP-SGD-family baselines: dp-adam, auto-s, dp-psac (algorithms/baselines/definition.py).

Each one runs the DP-SGD loop with the job's charged σ, q and steps straight from the job row, the
public expected batch size B as the normaliser, and a per-sample map whose norm bound S is the
sensitivity the API charged: the noise drawn per step is N(0, σ²S² I) on the sum. Before training,
the map's bound is checked against the catalogue's `sensitivity(hyperparameters)`, so the worker
never draws less noise than the event assumes.
"""

from __future__ import annotations

from algorithms.baselines.definition import (
    DPPSAC,
    AutoS,
    AutoSHyperparameters,
    DPAdam,
    DPAdamHyperparameters,
    DPPSACHyperparameters,
)
from algorithms.dp_sgd_loop import OptimizerChoice, run_with_per_sample_map
from algorithms.registry import definition_of
from algorithms.trainers import TrainingRequest, register_trainer
from dp.loop.state import TrainingResult
from dp.per_example.per_sample import AbadiClip
from dp.per_example.per_sample_maps import AutoSClip, PSACClip


@register_trainer(DPAdam)
def run_dp_adam(request: TrainingRequest[DPAdamHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    return run_with_per_sample_map(
        definition_of(DPAdam),
        request,
        AbadiClip(hyper.clipping_norm),
        optimizer=OptimizerChoice(
            "adam", weight_decay=hyper.weight_decay, betas=(hyper.beta1, hyper.beta2), eps=hyper.eps
        ),
    )


@register_trainer(AutoS)
def run_auto_s(request: TrainingRequest[AutoSHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    return run_with_per_sample_map(
        definition_of(AutoS),
        request,
        AutoSClip(hyper.clipping_norm, gamma=hyper.gamma),
        optimizer=OptimizerChoice(hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay),
    )


@register_trainer(DPPSAC)
def run_dp_psac(request: TrainingRequest[DPPSACHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    return run_with_per_sample_map(
        definition_of(DPPSAC),
        request,
        PSACClip(hyper.clipping_norm, r=hyper.r),
        optimizer=OptimizerChoice(hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay),
    )
