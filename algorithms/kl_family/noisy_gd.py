"""Noisy GD (Algorithm 4) and the proximal-point method (Algorithm 2) on the clipped full batch.

Algorithm 4 on F̃(w) = F(w) + L̃1‖w − z‖² (docs/algorithms/kl-family.md#what-it-does), S noisy steps:

    w_1 = z;  for s = 1..S:  w_{s+1} = Π_{B(z, R)}( w_s − (G(w_s) + 2L̃1(w_s − z) + ξ_s)/(L̃1·s) )
    output  w̄ = Σ_{s=1}^{S+1} s·w_s / ((S+1)(S+2)/2),      R = L0/(2L̃1)

Only G(w_s) + ξ_s touches the data (one Gaussian release, Δ = L0/n); the regulariser gradient,
the projection and the average are post-processing. ``noisy-gd`` runs it once with z = w0 and
ξ ~ N(0, (σ·L0/n)² I); ``proximal-point`` runs it T_out times with z = w_{t−1}, every inner release
sharing ρ/(T_out·S) of the budget. The checkpoint holds the current iterate (model), the centre z,
the weighted sum, the inner and outer counters, the spent share and the pass count.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import nn

from algorithms.kl_family.common import FullBatch, Progress, assign_flat, flat_params, restore, snapshot
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState

__all__ = ["InnerSolver", "InnerState", "inner_noise_std", "inner_step", "train_noisy_gd", "train_proximal_point"]


@dataclass
class InnerSolver:
    """Algorithm 4's public constants for one job."""

    lipschitz: float
    weak_convexity: float
    steps: int
    noise_std: float
    """std of ξ_s on the released average (before the noise safety margin)."""

    @property
    def radius(self) -> float:
        return self.lipschitz / (2.0 * self.weak_convexity)


@dataclass
class InnerState:
    center: torch.Tensor
    weighted_sum: torch.Tensor
    s: int = 0

    @classmethod
    def start(cls, w: torch.Tensor) -> InnerState:
        return cls(center=w.clone(), weighted_sum=w.clone())  # the s = 1 term: 1·w_1, w_1 = z

    def average(self) -> torch.Tensor:
        count = self.s + 1
        return self.weighted_sum / (count * (count + 1) / 2.0)


def inner_step(model: nn.Module, data: FullBatch, solver: InnerSolver, state: InnerState) -> None:
    """One noisy projected step w_s → w_{s+1} (one release) and the running weighted sum."""
    s = state.s + 1
    w = flat_params(model).double()
    noisy = data.noisy_gradient(model, noise_std=solver.noise_std)
    step = noisy + 2.0 * solver.weak_convexity * (w - state.center)
    moved = w - step / (solver.weak_convexity * s) - state.center
    distance = float(torch.linalg.vector_norm(moved))
    if distance > solver.radius:
        moved = moved * (solver.radius / distance)
    w_next = state.center + moved
    assign_flat(model, w_next)
    state.s = s
    state.weighted_sum = state.weighted_sum + (s + 1) * flat_params(model).double()


def _snapshot(
    step: int, model: nn.Module, data: FullBatch, inner: InnerState, scalars: dict[str, object]
) -> TrainingState:
    return snapshot(
        step=step,
        model=model,
        generator=data.generator,
        tensors={"center": inner.center, "weighted_sum": inner.weighted_sum},
        scalars={**scalars, "s": inner.s, "passes": data.passes},
    )


def _resume_inner(
    resume_from: TrainingState, model: nn.Module, data: FullBatch
) -> tuple[InnerState, dict[str, object]]:
    tensors, scalars = restore(resume_from, model, data.generator)
    device = next(model.parameters()).device
    inner = InnerState(
        center=tensors["center"].to(device),
        weighted_sum=tensors["weighted_sum"].to(device),
        s=int(scalars["s"]),
    )
    data.passes = int(scalars["passes"])
    return inner, scalars


def train_noisy_gd(
    model: nn.Module,
    data: FullBatch,
    *,
    solver: InnerSolver,
    hooks: TrainingHooks,
    resume_from: TrainingState | None = None,
) -> TrainingResult:
    """``solver.steps`` noisy steps (the job's charged steps); the model ends at w̄."""
    if resume_from is not None:
        inner, _ = _resume_inner(resume_from, model, data)
    else:
        inner = InnerState.start(flat_params(model).double())
    progress = Progress(hooks, step=inner.s)
    while inner.s < solver.steps:
        if progress.stop_requested():
            return progress.result(stopped=True)
        inner_step(model, data, solver, inner)
        progress.boundary(inner.s, lambda: _snapshot(inner.s, model, data, inner, {}))
    assign_flat(model, inner.average())
    return progress.result(stopped=False)


def train_proximal_point(
    model: nn.Module,
    data: FullBatch,
    *,
    solver: InnerSolver,
    outer_iterations: int,
    max_passes: int,
    hooks: TrainingHooks,
    resume_from: TrainingState | None = None,
) -> TrainingResult:
    """T_out prox steps; every inner release is ρ/(T_out·S) of the budget (solver.noise_std must be
    calibrated to that share). T_out = 0 returns w0 at zero cost."""
    share = Fraction(1, max(1, outer_iterations * solver.steps))
    outer = 1
    if resume_from is not None:
        inner, scalars = _resume_inner(resume_from, model, data)
        outer = int(scalars["outer"])  # type: ignore[call-overload]
    else:
        inner = InnerState.start(flat_params(model).double())

    def spent() -> Fraction:
        return share * ((outer - 1) * solver.steps + inner.s)

    progress = Progress(hooks, step=data.units_for(spent()))
    while outer <= outer_iterations:
        if inner.s == solver.steps:  # subproblem solved: w_t = w̄, next centre
            assign_flat(model, inner.average())
            outer += 1
            inner = InnerState.start(flat_params(model).double())
            continue
        if progress.stop_requested():
            return progress.result(stopped=True)
        if data.passes + 1 > max_passes:
            if inner.s:  # the pass cap cut a subproblem short: return its running average
                assign_flat(model, inner.average())
            break
        inner_step(model, data, solver, inner)
        progress.boundary(
            data.units_for(spent()),
            # partial, not a closure: the arguments are this iteration's values (the snapshot itself,
            # the costly part, is taken only when boundary() checkpoints, before it returns)
            functools.partial(_snapshot, data.units_for(spent()), model, data, inner, {"outer": outer}),
        )
    return progress.result(stopped=False)


def inner_noise_std(*, lipschitz: float, normaliser: float, rho: float, releases: int) -> float:
    """s = Δ·√(releases/(2ρ)), Δ = L0/n: each of ``releases`` equal Gaussians costs ρ/releases."""
    return (lipschitz / normaliser) * math.sqrt(releases / (2.0 * rho))
