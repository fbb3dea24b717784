"""What the KL-family loops share: clipped full-batch releases, flat parameter vectors, budget
units, progress hooks and checkpoints (algorithms/kl_family/accounting.py has the privacy derivation).

The catalogue's accounting constants (the noise safety margin, the rule that turns a spent share
of ρ into budget units) are passed in by the trainer in :class:`FullBatch`: nothing under
worker/optimizers imports the catalogue.

Every gradient-type release goes through the shared per-sample engine (``per_sample.py`` via
``dp_sgd.per_sample_map_aggregator``: ghost clipping where exact, else vmap), chunk by chunk; the
only new primitive is the clipped per-sample gradient DIFFERENCE of KL-Spider, which walks
``iter_per_sample_grads`` at two parameter points in lockstep over the same physical chunks, so
memory stays bounded by two chunks of per-sample gradients.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import torch
from torch import nn

from dp.loop.augmult import AugmentedViews
from dp.loop.batch_loop import UnitSampling, per_sample_map_aggregator
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.loop.units import PerUnitAggregator
from dp.losses import mean_over_unit_rows
from dp.per_example.aggregator import BatchAggregator
from dp.per_example.per_sample import (
    AbadiClip,
    add_weighted_rows,
    iter_per_sample_grads,
    per_sample_norms,
    rows_where,
    trainable_parameters,
    zeros_like_trainable,
)
from dp.randomness.noise import privatise_sum
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "FullBatch",
    "Progress",
    "ReleaseObserver",
    "UnitsFor",
    "assign_flat",
    "flat",
    "flat_params",
]


class ReleaseObserver(Protocol):
    """Test hook: sees every noisy release (public values) with the point it was taken at and the
    nominal noise std of the released average (before the noise safety margin)."""

    def __call__(self, kind: str, point: torch.Tensor, released: torch.Tensor, noise_std: float) -> None: ...


UnitsFor = Callable[[Fraction | float], int]
"""Budget units charged for a spent share of the job's ρ (the catalogue's rule)."""


def flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def flat_params(model: nn.Module) -> torch.Tensor:
    return flat({k: p.detach() for k, p in trainable_parameters(model).items()})


def assign_flat(model: nn.Module, vector: torch.Tensor) -> None:
    """Write a flat vector (any float dtype) into the trainable parameters, in engine order."""
    offset = 0
    with torch.no_grad():
        for p in trainable_parameters(model).values():
            count = p.numel()
            p.copy_(vector[offset : offset + count].view_as(p).to(p.dtype))
            offset += count


@dataclass
class FullBatch:
    """The private data and the public constants of one job's full-batch releases."""

    X: torch.Tensor
    y: torch.Tensor
    loss: str
    lipschitz: float
    normaliser: float
    """The PUBLIC n (registered n times 1 − hold-out fraction), never len(X)."""
    max_physical_batch_size: int
    generator: SecureRandom
    noise_safety: float
    """Every std is drawn this much above its allocation, so rounding only makes a release cheaper."""
    units_for: UnitsFor
    """The public progress count of a spent share of ρ (budget units)."""
    observer: ReleaseObserver | None = None
    units: UnitSampling | None = None
    """Per privacy unit: every pass draws each unit's row slots afresh from ``generator``, and a
    unit's mean gradient over them is one term of every sum (``normaliser`` counts units)."""
    passes: int = 0
    """Full passes over the data so far (a difference counts two): the public compute meter."""
    _old_model: nn.Module | None = field(default=None, repr=False)

    def _pass_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This pass's terms: the rows, or every unit's (n_units, k, ...) row slots."""
        if self.units is None:
            return self.X, self.y
        every_unit = torch.arange(self.units.index.n_units)
        slots = self.units.index.slots(every_unit, rows_per_unit=self.units.rows_per_unit, generator=self.generator)
        slots = slots.to(self.X.device)
        return self.X[slots], self.y[slots]

    def clipped_sum(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Σ_i clip_L0(∇f(w; x_i)) — PRIVATE; add/remove sensitivity L0 (i a row, or a unit's mean)."""
        aggregator: BatchAggregator = per_sample_map_aggregator(model, AbadiClip(self.lipschitz))
        if self.units is not None:
            aggregator = PerUnitAggregator(aggregator, self.units.rows_per_unit)
        self.passes += 1
        X, y = self._pass_data()
        return aggregator.clipped_sum(
            model,
            X,
            y,
            step=0,
            loss=self.loss,
            max_physical_batch_size=self.max_physical_batch_size,
            generator=self.generator,
        )

    def release(
        self, kind: str, model: nn.Module, grad_sum: dict[str, torch.Tensor], *, noise_std: float
    ) -> torch.Tensor:
        """(sum + N(0, (n·s·safety)² I))/n as a flat float64 vector: the Gaussian mechanism on the
        average with std s (one vector drawn from the job's generator, even when s = 0)."""
        released = privatise_sum(
            grad_sum,
            noise_std=noise_std * self.noise_safety * self.normaliser,
            normaliser=self.normaliser,
            generator=self.generator,
        )
        vector = flat(released).double()
        if self.observer is not None:
            self.observer(kind, flat_params(model).double(), vector, noise_std)
        return vector

    def noisy_gradient(self, model: nn.Module, *, noise_std: float, kind: str = "gradient") -> torch.Tensor:
        """G(w) + N(0, s² I): one full pass, one release (Δ = L0/n)."""
        return self.release(kind, model, self.clipped_sum(model), noise_std=noise_std)

    def noisy_scalar(self, kind: str, model: nn.Module, value: float, *, noise_std: float) -> float:
        """value + N(0, s²): a scalar Gaussian release from the job's SecureRandom."""
        noise = self.generator.normal((), std=1.0, dtype=torch.float64)
        released = float(value) + float(noise) * noise_std * self.noise_safety
        if self.observer is not None:
            self.observer(kind, flat_params(model).double(), torch.tensor([released], dtype=torch.float64), noise_std)
        return released

    def clipped_difference_sum(
        self, model: nn.Module, old_point: torch.Tensor, *, clip: float
    ) -> dict[str, torch.Tensor]:
        """Σ_i clip_C(clip_L0(∇f(w'; x_i)) − clip_L0(∇f(w; x_i))), w' = model, w = old_point.

        PRIVATE; add/remove sensitivity C. Both points see the same rows in the same physical
        chunks; a row whose gradient at either point is not finite contributes zero (within C).
        """
        if self._old_model is None:
            self._old_model = copy.deepcopy(model)
        old = self._old_model
        assign_flat(old, old_point)
        lipschitz_clip, difference_clip = AbadiClip(self.lipschitz), AbadiClip(clip)
        total = zeros_like_trainable(model)
        chunks = dict(loss=self.loss, max_physical_batch_size=self.max_physical_batch_size)
        X, y = self._pass_data()  # the same terms at both points
        new_model, old_model = model, old
        if self.units is not None:  # one term per unit: its slots' mean gradient (parameter names kept)
            k = self.units.rows_per_unit
            new_model, old_model = AugmentedViews(model), AugmentedViews(old)
            chunks = dict(
                loss=mean_over_unit_rows(self.loss), max_physical_batch_size=max(1, self.max_physical_batch_size // k)
            )
        self.passes += 2
        with torch.no_grad():
            for new_grads, old_grads in zip(
                iter_per_sample_grads(new_model, X, y, **chunks),  # type: ignore[arg-type]
                iter_per_sample_grads(old_model, X, y, **chunks),  # type: ignore[arg-type]
                strict=True,
            ):
                new_norms, old_norms = per_sample_norms(new_grads), per_sample_norms(old_grads)
                finite = torch.isfinite(new_norms) & torch.isfinite(old_norms)
                all_finite = bool(finite.all())
                new_scale = torch.where(finite, lipschitz_clip.scale_factors(new_norms), 0.0)
                old_scale = torch.where(finite, lipschitz_clip.scale_factors(old_norms), 0.0)
                diffs = {}
                for name in new_grads:
                    g_new, g_old = new_grads[name], old_grads[name]
                    if not all_finite:  # 0·inf would be NaN: zero such rows first
                        g_new, g_old = rows_where(finite, g_new), rows_where(finite, g_old)
                    shape = (-1, *[1] * (g_new.dim() - 1))
                    diff = g_new.mul_(new_scale.view(shape))  # in place: the chunk is ours
                    diffs[name] = diff.sub_(g_old.mul_(old_scale.view(shape)))
                del new_grads, old_grads
                add_weighted_rows((total,), diffs, (difference_clip.scale_factors,))
        return total


class Progress:
    """Heartbeat, cancel and checkpoints at release boundaries, with ``step`` = public progress
    count (budget units, or steps for noisy-gd)."""

    REPORT_EVERY_RELEASES = 25

    def __init__(self, hooks: TrainingHooks, *, step: int) -> None:
        self.hooks = hooks
        self.step = step
        self._reported = step
        self._since_report = 0

    def stop_requested(self) -> bool:
        return self.hooks.should_stop is not None and self.hooks.should_stop()

    def boundary(self, step: int, snapshot: Callable[[], TrainingState]) -> None:
        """After a release: checkpoint when ``step`` crosses a multiple of checkpoint_every, then
        report progress when it changed (or every few releases, as a heartbeat)."""
        previous, self.step = self.step, step
        every = self.hooks.checkpoint_every
        if self.hooks.save_checkpoint is not None and every > 0 and step // every > previous // every:
            self.hooks.save_checkpoint(snapshot())
        self._since_report += 1
        if self.hooks.on_step_end is not None and (
            step != self._reported or self._since_report >= self.REPORT_EVERY_RELEASES
        ):
            self.hooks.on_step_end(step)
            self._reported, self._since_report = step, 0

    def result(self, *, stopped: bool) -> TrainingResult:
        return TrainingResult(steps_run=self.step, stopped_early=stopped)


def snapshot(
    *,
    step: int,
    model: nn.Module,
    generator: SecureRandom,
    tensors: dict[str, torch.Tensor],
    scalars: dict[str, Any],
) -> TrainingState:
    """A TrainingState whose optimizer_state carries the algorithm's private tensors (slot 0) and
    its JSON scalars (first param group), as training.artifacts stores them."""
    return TrainingState(
        step=step,
        model_state={k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
        optimizer_state={
            "state": {0: {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}},
            "param_groups": [{"kl_state": copy.deepcopy(scalars)}],
        },
        generator_state=generator.get_state().clone(),
    )


def restore(
    state: TrainingState, model: nn.Module, generator: SecureRandom
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load model and generator; return the algorithm's tensors and scalars of a ``snapshot``."""
    model.load_state_dict(state.model_state, strict=True)
    generator.set_state(state.generator_state)
    slots = state.optimizer_state.get("state", {})
    tensors = dict(slots.get(0, {})) if isinstance(slots, dict) else {}
    groups = state.optimizer_state.get("param_groups")
    if not (isinstance(groups, list) and groups and isinstance(groups[0], dict) and "kl_state" in groups[0]):
        raise ValueError("checkpoint has no KL-family state")
    return tensors, dict(groups[0]["kl_state"])


def finite_norm(vector: torch.Tensor) -> float:
    value = float(torch.linalg.vector_norm(vector))
    return value if math.isfinite(value) else math.inf
