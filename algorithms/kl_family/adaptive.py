"""Adaptive noisy GD (Algorithm 3), clipped full batch.

Calibration: docs/algorithms/kl-family.md#privacy-calibration-as-we-charge-it.

    while spent ≤ ρ/2:                                         (zCDP filter)
        u   ← Σ_i clip_L0(∇f(w; x_i)) / n                      one pass, used twice
        N_t ← ‖u‖ + N(0, ŝ²)                                   cost c_N
        s_t ← max(N_t⁺/√(dA), s_min)                           a function of the released N_t
        w   ← w − (u + N(0, s_t² I)) / (2·L1)                  cost Δ²/(2s_t²) ≤ ρ/2 − c_N
        stop after a floor step (s_t = s_min)

Both the filter and the floor test read released values only, so where the run stops is public
and settling the ledger with the units actually spent is sound (algorithms/kl_family/accounting.py).
The checkpoint holds w (model), the spent ρ (float; exact costs of the std's used), the pass
count and the finished flag.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
from torch import nn

from algorithms.kl_family.common import FullBatch, Progress, assign_flat, flat, flat_params, restore, snapshot
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState

__all__ = ["AdaptiveSchedule", "train_adaptive_noisy_gd"]


class AdaptiveSchedule(Protocol):
    """The public constants of one job (the catalogue's ``AdaptiveConstants``, built by the trainer)."""

    @property
    def rho(self) -> float: ...
    @property
    def norm_noise(self) -> float: ...
    @property
    def norm_cost(self) -> float: ...
    @property
    def floor_noise(self) -> float: ...
    def gradient_noise(self, noisy_norm: float) -> float: ...
    def gradient_cost(self, noise: float) -> float: ...


def train_adaptive_noisy_gd(
    model: nn.Module,
    data: FullBatch,
    *,
    constants: AdaptiveSchedule | None,
    smoothness: float,
    max_passes: int,
    hooks: TrainingHooks,
    resume_from: TrainingState | None = None,
) -> TrainingResult:
    """Run in place on ``model``; ``constants`` None means the run cannot start (w0, no cost)."""
    spent, finished = 0.0, False
    if resume_from is not None:
        _, scalars = restore(resume_from, model, data.generator)
        spent, finished = float(scalars["spent"]), bool(scalars["finished"])
        data.passes = int(scalars["passes"])
    if constants is None:
        return Progress(hooks, step=0).result(stopped=False)
    rho = constants.rho
    progress = Progress(hooks, step=data.units_for(spent / rho))
    n = data.normaliser

    while not finished and spent <= rho / 2.0:
        if progress.stop_requested():
            return progress.result(stopped=True)
        if data.passes + 1 > max_passes:
            break
        grad_sum = data.clipped_sum(model)
        exact_norm = float(torch.linalg.vector_norm(flat(grad_sum).double())) / n  # PRIVATE
        noisy_norm = data.noisy_scalar("norm", model, exact_norm, noise_std=constants.norm_noise)
        del exact_norm
        noise = constants.gradient_noise(noisy_norm)
        gradient = data.release("gradient", model, grad_sum, noise_std=noise)
        del grad_sum
        assign_flat(model, flat_params(model).double() - gradient / (2.0 * smoothness))
        spent += constants.norm_cost + constants.gradient_cost(noise)
        finished = noise == constants.floor_noise
        progress.boundary(
            data.units_for(spent / rho),
            # partial, not a closure: the arguments are this iteration's values (the snapshot itself,
            # the costly part, is taken only when boundary() checkpoints, before it returns)
            functools.partial(
                snapshot,
                step=data.units_for(spent / rho),
                model=model,
                generator=data.generator,
                tensors={},
                scalars={"spent": spent, "finished": finished, "passes": data.passes},
            ),
        )
    return progress.result(stopped=False)
