"""The dc-dpsgd trainers: the job's charged σ, q and steps go into the DP-SGD loop with a
DC-DPSGD aggregator (rank or threshold rule) in place of plain clipping.

The gradient noise on the sum is σ·Δ with Δ the aggregator's sensitivity (2·c1 − c2 or c1),
which is the catalogue's ``PrivacyPlan.sensitivity``. On a dataset with a privacy unit column the
loop samples units and each sampled unit's gradient (the mean over its row slots,
dp/loop/units.py) is one "sample" of the rank or threshold rule; with threshold tracking, the tail count
gets N(0, (r·σ)²) — the σ_b that the event's σ_eff = σ/sqrt(1 + 1/r²) was computed from.

Checkpoints. The loop's checkpoint holds model, optimizer and SecureRandom state; W_t (keyed by
the job key derived from that state), the trace noise and the tie-breaking order are redrawn from
the restored stream, so they need nothing more. The tracked threshold τ_t is extra state: it is
written into the checkpoint's first optimizer param group under :data:`TAU_CHECKPOINT_KEY`
(param groups are stored as JSON by training.artifacts and restored by
``Optimizer.load_state_dict``; the optimizers ignore unknown keys) and read back on resume, so a
resumed run is bit-identical to an uninterrupted one. A checkpoint without the key (written by
an older version) restarts tracking from τ_0: still private (τ_0 is public), only the threshold trajectory differs.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from torch import nn

from algorithms.dc_dpsgd.aggregators import RankAggregator, ThresholdAggregator, ThresholdTracker
from algorithms.dc_dpsgd.definition import (
    DCCommonHyperparameters,
    DCDPSGDHyperparameters,
    DCDPSGDRank,
    DCDPSGDThreshold,
    DCDPSGDThresholdHyperparameters,
)
from algorithms.dc_dpsgd.projection import StreamingProjection
from algorithms.dp_sgd_loop import OptimizerChoice, run_loop
from algorithms.trainers import TrainingRequest, register_preflight, register_trainer
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.per_example.per_sample import trainable_parameters

log = logging.getLogger(__name__)

TAU_CHECKPOINT_KEY = "dc_dpsgd_threshold_tau"


def _projection(hyper: DCCommonHyperparameters) -> StreamingProjection:
    scope = None if hyper.scope == "all" else tuple(hyper.scope)
    return StreamingProjection(k=hyper.k, theta=hyper.theta, scope=scope)


def check_projection_scope(model: nn.Module, hyper: DCCommonHyperparameters) -> None:
    """k < d_J and known scope names, checked before TOUCH (a ValueError releases the job)."""
    _projection(hyper).scope_sizes(trainable_parameters(model))


register_preflight(DCDPSGDRank)(check_projection_scope)
register_preflight(DCDPSGDThreshold)(check_projection_scope)


def _run(
    request: TrainingRequest[Any],
    hyper: DCCommonHyperparameters,
    aggregator: RankAggregator | ThresholdAggregator,
    hooks: TrainingHooks,
) -> TrainingResult:
    aggregator.check(request.model)  # unknown scope names or k >= d_J fail before any step
    optimizer = OptimizerChoice(hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay)
    return run_loop(request, aggregator, optimizer=optimizer, hooks=hooks)


@register_trainer(DCDPSGDRank)
def run_dc_dpsgd(request: TrainingRequest[DCDPSGDHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    aggregator = RankAggregator(
        c1=hyper.tail_clip,
        c2=hyper.c2,
        projection=_projection(hyper),
        sigma_tr=hyper.sigma_tr,
        p=hyper.p,
    )
    return _run(request, hyper, aggregator, request.hooks)


def _saved_tau(state: TrainingState) -> Any:
    groups = state.optimizer_state.get("param_groups")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        return groups[0].get(TAU_CHECKPOINT_KEY)
    return None


def _with_tau_in_checkpoints(hooks: TrainingHooks, aggregator: ThresholdAggregator) -> TrainingHooks:
    save = hooks.save_checkpoint
    if save is None:
        return hooks

    def save_with_tau(state: TrainingState) -> None:
        groups = state.optimizer_state.get("param_groups")  # the snapshot's own deep copy
        assert isinstance(groups, list) and groups
        groups[0][TAU_CHECKPOINT_KEY] = aggregator.tau
        save(state)

    return dataclasses.replace(hooks, save_checkpoint=save_with_tau)


@register_trainer(DCDPSGDThreshold)
def run_dc_dpsgd_threshold(request: TrainingRequest[DCDPSGDThresholdHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    tracker = None
    if hyper.tracking:
        tracker = ThresholdTracker(
            target_fraction=hyper.p,
            eta=hyper.eta_tau,
            count_noise_std=hyper.threshold_noise_ratio * request.noise_multiplier,  # σ_b = r·σ
            expected_batch_size=request.expected_batch_size,
        )
    aggregator = ThresholdAggregator(
        c1=hyper.tail_clip,
        c2=hyper.c2,
        projection=_projection(hyper),
        sigma_tr=hyper.sigma_tr,
        tau=hyper.tau,
        tracker=tracker,
    )
    hooks = request.hooks
    if tracker is not None:
        if request.resume_from is not None and request.resume_from.step > 0:
            saved = _saved_tau(request.resume_from)
            if saved is None:
                log.warning("dc-dpsgd-threshold resumed without a saved threshold; tracking restarts")
            aggregator.load_state_dict({"tau": saved})
        hooks = _with_tau_in_checkpoints(hooks, aggregator)
    return _run(request, hyper, aggregator, hooks)
