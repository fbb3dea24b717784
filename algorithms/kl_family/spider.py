"""KL-Spider (Algorithm 1; docs/algorithms/kl-family.md#privacy-calibration-as-we-charge-it) on the clipped full batch.

Per round k (public Φ̂_k, T_k, r_k, C_k, τ_k from ``spider_schedule``):

    g ← G(w) + N(0, ŝ² I)                                   share θ/K of ρ
    while t < T_k and ‖g‖ ≥ τ_k:
        w' ← w − r_k·g/‖g‖;  t += 1                          post-processing
        if t < T_k: g ← g + D(w', w; C_k) + N(0, s_k² I)     share (1−θ)/(K·M_k)
        w ← w'

The round's tests read only the released g, so stopping never costs privacy. The spent share is
exact (Fractions) and the progress count is ⌈U·share⌉ budget units. The loop is a sequence of
boundaries (after each release); the checkpoint at a boundary holds w (model), g, the round
state, the spent share and the pass count, so a resumed run is identical to an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import torch
from torch import nn

from algorithms.kl_family.common import FullBatch, Progress, assign_flat, flat_params, restore, snapshot
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState

__all__ = ["SpiderPlan", "SpiderRoundPlan", "SpiderState", "train_kl_spider"]


class SpiderRoundPlan(Protocol):
    """Round k's public parameters (the catalogue's ``SpiderRound``)."""

    @property
    def steps(self) -> int: ...
    @property
    def step_length(self) -> float: ...
    @property
    def difference_clip(self) -> float: ...
    @property
    def threshold(self) -> float: ...
    @property
    def difference_noise(self) -> float: ...


class SpiderPlan(Protocol):
    """The public schedule of one job (the catalogue's ``SpiderSchedule``, built by the trainer)."""

    @property
    def K(self) -> int: ...
    @property
    def start_noise(self) -> float: ...
    @property
    def start_share(self) -> Fraction: ...
    def round(self, k: int) -> SpiderRoundPlan: ...
    def difference_share(self, k: int) -> Fraction: ...


@dataclass
class SpiderState:
    round: int = 1
    t: int = 0
    started: bool = False
    g: torch.Tensor | None = None
    spent: Fraction = Fraction(0)

    def scalars(self, passes: int) -> dict[str, object]:
        return {
            "round": self.round,
            "t": self.t,
            "started": self.started,
            "spent_num": self.spent.numerator,
            "spent_den": self.spent.denominator,
            "passes": passes,
        }


def train_kl_spider(
    model: nn.Module,
    data: FullBatch,
    *,
    schedule: SpiderPlan | None,
    max_passes: int,
    hooks: TrainingHooks,
    resume_from: TrainingState | None = None,
) -> TrainingResult:
    """Run the schedule (None: nothing to do, w0 is returned at zero cost) in place on ``model``."""
    state = SpiderState()
    if resume_from is not None:
        tensors, scalars = restore(resume_from, model, data.generator)
        state = SpiderState(
            round=int(scalars["round"]),
            t=int(scalars["t"]),
            started=bool(scalars["started"]),
            g=tensors.get("g"),
            spent=Fraction(int(scalars["spent_num"]), int(scalars["spent_den"])),
        )
        data.passes = int(scalars["passes"])
    progress = Progress(hooks, step=data.units_for(state.spent))
    if schedule is None:
        return progress.result(stopped=False)
    device = next(model.parameters()).device
    if state.g is not None:
        state.g = state.g.to(device)

    def boundary() -> None:
        assert state.g is not None
        progress.boundary(
            data.units_for(state.spent),
            lambda: snapshot(
                step=data.units_for(state.spent),
                model=model,
                generator=data.generator,
                tensors={"g": state.g},  # type: ignore[dict-item]
                scalars=state.scalars(data.passes),
            ),
        )

    while state.round <= schedule.K:
        rnd = schedule.round(state.round)
        if not state.started:
            if progress.stop_requested():
                return progress.result(stopped=True)
            if data.passes + 1 > max_passes:
                break
            state.g = data.noisy_gradient(model, noise_std=schedule.start_noise, kind="round-start")
            state.spent += schedule.start_share
            state.started, state.t = True, 0
            boundary()
            continue
        assert state.g is not None
        norm = float(torch.linalg.vector_norm(state.g))
        if not (state.t < rnd.steps and norm >= rnd.threshold):
            state.round, state.started, state.t = state.round + 1, False, 0
            continue
        w = flat_params(model).double()
        w_new = w - rnd.step_length * state.g / norm
        if state.t + 1 < rnd.steps:  # a difference follows this step
            if progress.stop_requested():
                return progress.result(stopped=True)
            if data.passes + 2 > max_passes:
                break
            assign_flat(model, w_new)
            diff_sum = data.clipped_difference_sum(model, w, clip=rnd.difference_clip)
            state.g = state.g + data.release("difference", model, diff_sum, noise_std=rnd.difference_noise)
            state.spent += schedule.difference_share(state.round)
            state.t += 1
            boundary()
        else:  # the round's last step needs no difference
            assign_flat(model, w_new)
            state.t += 1
    return progress.result(stopped=False)
