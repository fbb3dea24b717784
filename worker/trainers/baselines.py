"""Trainers of the DP-SGD-family baselines: dp-adam, auto-s, dp-psac (app/algorithms/baselines.py).

Each one runs the DP-SGD loop with the job's charged σ, q and steps straight from the job row, the
public expected batch size B as the normaliser, and a per-sample map whose norm bound S is the
sensitivity the API charged: the noise drawn per step is N(0, σ²S² I) on the sum. Before training,
the map's bound is checked against the catalogue's `sensitivity(hyperparameters)`, so the worker
never draws less noise than the event assumes.
"""

from __future__ import annotations

from app.algorithms.baselines import (
    AutoSHyperparameters,
    DPAdamHyperparameters,
    DPPSACHyperparameters,
)
from worker.optimizers.per_sample import AbadiClip
from worker.optimizers.per_sample_maps import AutoSClip, PSACClip
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_trainer
from worker.trainers.per_sample_map import hyperparameters_of, run_with_per_sample_map


@register_trainer("dp-adam")
def run_dp_adam(request: TrainingRequest) -> TrainingResult:
    hyper = hyperparameters_of("dp-adam", request)
    assert isinstance(hyper, DPAdamHyperparameters)
    return run_with_per_sample_map(
        "dp-adam", request, hyper, AbadiClip(hyper.clipping_norm),
        optimizer="adam", weight_decay=hyper.weight_decay,
        adam_betas=(hyper.beta1, hyper.beta2), adam_eps=hyper.eps,
    )


@register_trainer("auto-s")
def run_auto_s(request: TrainingRequest) -> TrainingResult:
    hyper = hyperparameters_of("auto-s", request)
    assert isinstance(hyper, AutoSHyperparameters)
    return run_with_per_sample_map(
        "auto-s", request, hyper, AutoSClip(hyper.clipping_norm, gamma=hyper.gamma),
        optimizer=hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay,
    )


@register_trainer("dp-psac")
def run_dp_psac(request: TrainingRequest) -> TrainingResult:
    hyper = hyperparameters_of("dp-psac", request)
    assert isinstance(hyper, DPPSACHyperparameters)
    return run_with_per_sample_map(
        "dp-psac", request, hyper, PSACClip(hyper.clipping_norm, r=hyper.r),
        optimizer=hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay,
    )
