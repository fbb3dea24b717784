"""Trainers of the DP-SGD-family baselines: dp-adam, auto-s, dp-psac (app/algorithms/baselines.py).

Each one runs the DP-SGD loop with the job's charged σ, q and steps straight from the job row, the
public expected batch size B as the normaliser, and a per-sample map whose norm bound S is the
sensitivity the API charged: the noise drawn per step is N(0, σ²S² I) on the sum. Before training,
the map's bound is checked against the catalogue's `sensitivity(hyperparameters)`, so the worker
never draws less noise than the event assumes.
"""

from __future__ import annotations

from pydantic import BaseModel

from app.algorithms import get_algorithm
from app.algorithms.baselines import (
    AutoSHyperparameters,
    DPAdamHyperparameters,
    DPPSACHyperparameters,
)
from worker.optimizers.dp_sgd import DPSGDConfig, per_sample_map_aggregator, train_dp_sgd
from worker.optimizers.per_sample import AbadiClip, PerSampleMap
from worker.optimizers.per_sample_maps import AutoSClip, PSACClip
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_trainer


def _hyperparameters(name: str, request: TrainingRequest) -> BaseModel:
    """The job's hyperparameters, re-validated by the catalogue entry that priced the job."""
    return get_algorithm(name).validate_hyperparameters(
        request.spec["algorithm"]["hyperparameters"]
    )


def _run(
    name: str,
    request: TrainingRequest,
    hyper: BaseModel,
    per_sample_map: PerSampleMap,
    *,
    optimizer: str,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    adam_betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
) -> TrainingResult:
    charged = get_algorithm(name).sensitivity(hyper)  # type: ignore[attr-defined]
    if per_sample_map.norm_bound != charged:
        raise RuntimeError(
            f"{name}: the per-sample map's bound differs from the charged sensitivity"
        )
    config = DPSGDConfig(
        steps=request.steps,
        sampling_probability=request.sampling_probability,
        noise_multiplier=request.noise_multiplier,
        clipping_norm=per_sample_map.norm_bound,
        learning_rate=float(request.spec["training"]["learning_rate"]),
        momentum=momentum,
        weight_decay=weight_decay,
        loss="cross_entropy" if request.task == "classification" else "mse",
        max_physical_batch_size=request.max_physical_batch_size,
        optimizer=optimizer,  # type: ignore[arg-type]
        adam_betas=adam_betas,
        adam_eps=adam_eps,
        expected_batch_size=request.expected_batch_size,
    )
    return train_dp_sgd(
        request.model,
        request.X,
        request.y,
        config=config,
        generator=request.generator,
        hooks=request.hooks,
        resume_from=request.resume_from,
        device=request.device,
        aggregator=per_sample_map_aggregator(request.model, per_sample_map),
    )


@register_trainer("dp-adam")
def run_dp_adam(request: TrainingRequest) -> TrainingResult:
    hyper = _hyperparameters("dp-adam", request)
    assert isinstance(hyper, DPAdamHyperparameters)
    return _run(
        "dp-adam", request, hyper, AbadiClip(hyper.clipping_norm),
        optimizer="adam", weight_decay=hyper.weight_decay,
        adam_betas=(hyper.beta1, hyper.beta2), adam_eps=hyper.eps,
    )


@register_trainer("auto-s")
def run_auto_s(request: TrainingRequest) -> TrainingResult:
    hyper = _hyperparameters("auto-s", request)
    assert isinstance(hyper, AutoSHyperparameters)
    return _run(
        "auto-s", request, hyper, AutoSClip(hyper.clipping_norm, gamma=hyper.gamma),
        optimizer=hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay,
    )


@register_trainer("dp-psac")
def run_dp_psac(request: TrainingRequest) -> TrainingResult:
    hyper = _hyperparameters("dp-psac", request)
    assert isinstance(hyper, DPPSACHyperparameters)
    return _run(
        "dp-psac", request, hyper, PSACClip(hyper.clipping_norm, r=hyper.r),
        optimizer=hyper.optimizer, momentum=hyper.momentum, weight_decay=hyper.weight_decay,
    )
