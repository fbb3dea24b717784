"""Trainers of the KL-condition family: the job's charged σ becomes the paper's schedule.

For the budget-unit algorithms the job's ρ = 1/(2σ²) (σ = the job's stored noise multiplier) and
the public n = ``request.expected_batch_size`` (registered n × (1 − hold-out fraction)) feed the
same torch-free schedule functions the catalogue documents; for ``noisy-gd`` σ is the per-step
noise multiplier (std σ·L0 on the clipped sum). d is the number of trainable parameters (public:
it follows from the model spec and the dataset's shape).
"""

from __future__ import annotations

import logging
from typing import Any

from algorithms.kl_family.accounting import NOISE_SAFETY, full_batch_passes, rho_of, units_for
from algorithms.kl_family.adaptive import train_adaptive_noisy_gd
from algorithms.kl_family.common import FullBatch, ReleaseObserver
from algorithms.kl_family.definition import AdaptiveNoisyGD, KLSpider, NoisyGD, ProximalPoint
from algorithms.kl_family.hyperparameters import (
    AdaptiveNoisyGDHyperparameters,
    KLSpiderHyperparameters,
    NoisyGDHyperparameters,
    ProximalPointHyperparameters,
)
from algorithms.kl_family.noisy_gd import InnerSolver, inner_noise_std, train_noisy_gd, train_proximal_point
from algorithms.kl_family.schedules import adaptive_constants, inner_solver_steps, outer_iterations, spider_schedule
from algorithms.kl_family.spider import train_kl_spider
from algorithms.trainers import TrainingRequest, register_trainer
from dp.data.rows import materialise
from dp.loop.state import TrainingResult
from dp.loop.units import unit_slots
from dp.per_example.per_sample import check_supported, trainable_parameters

__all__ = ["full_batch", "max_passes"]

log = logging.getLogger(__name__)


def max_passes(request: TrainingRequest[Any]) -> int:
    """``training.steps`` or ⌈epochs⌉: the public cap on full passes over the data."""
    return full_batch_passes(request.training)


def full_batch(request: TrainingRequest[Any], lipschitz: float, observer: ReleaseObserver | None = None) -> FullBatch:
    """Prepare the model and wrap the private rows with the job's public constants (and the
    catalogue's accounting rules: noise safety margin, budget units)."""
    check_supported(request.model)
    if request.sampling_probability != 1.0:
        raise ValueError("KL-family jobs are full batch (q = 1)")
    request.model.to(request.device)
    request.model.eval()  # no dropout: both points of a difference see the same function
    return FullBatch(
        X=materialise(request.features),
        y=request.y,
        loss=request.loss,
        lipschitz=lipschitz,
        normaliser=request.expected_batch_size,
        max_physical_batch_size=request.max_physical_batch_size,
        generator=request.generator,
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
        observer=observer,
        units=unit_slots(request.units, rows_per_unit=request.training.rows_per_unit),
    )


def _dimension(request: TrainingRequest[Any]) -> int:
    return sum(p.numel() for p in trainable_parameters(request.model).values())


def _rho(request: TrainingRequest[Any]) -> float:
    return rho_of(request.noise_multiplier)


@register_trainer(KLSpider)
def run_kl_spider(
    request: TrainingRequest[KLSpiderHyperparameters], observer: ReleaseObserver | None = None
) -> TrainingResult:
    hyper = request.hyperparameters
    assert hyper.F0 is not None  # the schema's validator fills it
    data = full_batch(request, hyper.L0, observer)
    schedule = spider_schedule(
        n=request.expected_batch_size,
        d=_dimension(request),
        rho=_rho(request),
        L0=hyper.L0,
        L1=hyper.L1,
        gamma=hyper.gamma,
        kappa=hyper.kappa,
        F0=hyper.F0,
        beta=hyper.beta,
        theta=hyper.theta,
    )
    # Public facts only (the schedule is a function of public constants and ρ).
    if schedule is None:
        log.warning("kl-spider: log F0 + κ·log(n√ρ/(γL0√d)) ≤ 0, the target is met at w0; nothing is run")
    elif schedule.vacuous:
        log.warning("kl-spider: the schedule is vacuous (Φ_floor = F0): the utility guarantee says nothing")
    return train_kl_spider(
        request.model,
        data,
        schedule=schedule,
        max_passes=max_passes(request),
        hooks=request.hooks,
        resume_from=request.resume_from,
    )


@register_trainer(AdaptiveNoisyGD)
def run_adaptive_noisy_gd(
    request: TrainingRequest[AdaptiveNoisyGDHyperparameters], observer: ReleaseObserver | None = None
) -> TrainingResult:
    hyper = request.hyperparameters
    data = full_batch(request, hyper.L0, observer)
    constants = adaptive_constants(
        n=request.expected_batch_size,
        d=_dimension(request),
        rho=_rho(request),
        L0=hyper.L0,
        beta=hyper.beta,
    )
    if constants is None:
        log.warning("adaptive-noisy-gd: n√ρ is too small for the ρ/2 filter; the model is returned untouched")
    return train_adaptive_noisy_gd(
        request.model,
        data,
        constants=constants,
        smoothness=hyper.L1,
        max_passes=max_passes(request),
        hooks=request.hooks,
        resume_from=request.resume_from,
    )


@register_trainer(NoisyGD)
def run_noisy_gd(
    request: TrainingRequest[NoisyGDHyperparameters], observer: ReleaseObserver | None = None
) -> TrainingResult:
    hyper = request.hyperparameters
    data = full_batch(request, hyper.L0, observer)
    solver = InnerSolver(
        lipschitz=hyper.L0,
        weak_convexity=hyper.L1_tilde,
        steps=request.steps,
        noise_std=request.noise_multiplier * hyper.L0 / request.expected_batch_size,
    )
    return train_noisy_gd(
        request.model,
        data,
        solver=solver,
        hooks=request.hooks,
        resume_from=request.resume_from,
    )


@register_trainer(ProximalPoint)
def run_proximal_point(
    request: TrainingRequest[ProximalPointHyperparameters], observer: ReleaseObserver | None = None
) -> TrainingResult:
    hyper = request.hyperparameters
    data = full_batch(request, hyper.L0, observer)
    n, d, rho = request.expected_batch_size, _dimension(request), _rho(request)
    t_out = outer_iterations(
        n=n,
        d=d,
        rho=rho,
        L0=hyper.L0,
        L1_tilde=hyper.L1_tilde,
        gamma=hyper.gamma,
        kappa=hyper.kappa,
        F0=hyper.F0,
    )
    steps = inner_solver_steps(
        n=n,
        d=d,
        rho_in=rho / max(1, t_out),
        beta_in=hyper.beta / max(1, t_out),
        cap=hyper.max_inner_steps,
    )
    solver = InnerSolver(
        lipschitz=hyper.L0,
        weak_convexity=hyper.L1_tilde,
        steps=steps,
        noise_std=inner_noise_std(lipschitz=hyper.L0, normaliser=n, rho=rho, releases=max(1, t_out) * steps),
    )
    return train_proximal_point(
        request.model,
        data,
        solver=solver,
        outer_iterations=t_out,
        max_passes=max_passes(request),
        hooks=request.hooks,
        resume_from=request.resume_from,
    )
