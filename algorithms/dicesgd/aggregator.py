"""DiceSGD's error-feedback aggregator for the DP-SGD loop (docs/algorithms/dicesgd.md#what-it-does).

:class:`ErrorFeedbackAggregator` implements :class:`dp.per_example.aggregator.BatchAggregator`, so
the shared loop ``train_dp_sgd`` does the Poisson sampling, the ONE Gaussian draw per step, the
division by the public B, SGD/Adam, cancellation, heartbeats and checkpoints. Per step it returns
the sum-scale data part of the release and updates the hidden state:

    Σ_i φ(g_i) + B·ψ(e_t)             (released after N(0, (σ·Δ_sum)² I) is added and /B)
    e_{t+1} = e_t − ψ(e_t) + (1/B)·Σ_i (1 − w_i)·g_i,   w_i = φ's scale factor of row i

which is Algorithm 2's e_{t+1} = e_t + ḡ − v with the NOISELESS v = c̄ + ψ(e_t): the noise never
enters e (docs/algorithms/dicesgd.md#what-it-does). The two sums come from the shared engines,
chosen like DP-SGD's aggregator: where ghost clipping is exact for every layer (``ghost.supports``), ONE
book-keeping pass of ``ghost_weighted_grad_sums`` with the two weightings w_i and 1 − w_i (no
per-sample gradient is materialised); otherwise ONE pass of the vmap engine (``weighted_grad_sums``)
contracting each chunk with the 2×m weight matrix [w_i, 1 − w_i]. Both give the same sums up to
rounding. A row whose gradient is not finite gets weight 0 in both sums, exactly as in
``clipped_grad_sum``.

ψ (the error-feedback map) always returns a vector of norm ≤ C2 — the bound the sensitivity
C1/B + 2·C2 (algorithms.dicesgd.definition) rests on — whatever e is: its scale is computed in float64
and shrunk by (1 − 2⁻²⁰) so that rounding the product to e's dtype cannot push the norm past C2
(the product is taken in float64, where a float32 scale could be subnormal, and products below
e's smallest normal value, whose rounding could grow them by more than the shrink, are set to 0),
and a non-finite ‖e‖ (overflow) gives ψ(e) = 0 and resets e to 0 (privacy-neutral: ψ stays
bounded; it only changes the algorithm, and only after an overflow).

SECRET: ``error`` (e), its norm and anything derived from it stay in this object and in the
worker's private checkpoint; nothing here logs or returns them except ``state_dict`` for the
checkpoint. e is kept in at least float32 (it accumulates).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from dp.data.rows import Rows
from dp.data.units import UnitIndex
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.loop.units import unit_sampling
from dp.per_example.aggregator import BatchAggregator, BatchContext, TensorDict
from dp.per_example.engines import Engine, check_engine, uses_ghost
from dp.per_example.ghost import ghost_weighted_grad_sums
from dp.per_example.per_sample import (
    PerSampleMap,
    trainable_parameters,
    weighted_grad_sums,
    zeros_like_trainable,
)
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "ERROR_FEEDBACK_CHECKPOINT_KEY",
    "ErrorFeedbackAggregator",
    "ErrorFeedbackClip",
    "ErrorFeedbackMap",
    "ErrorFeedbackNormalise",
    "apply_feedback_map",
    "split_error_feedback",
    "train_dicesgd",
    "with_error_feedback_in_checkpoints",
]

ERROR_FEEDBACK_CHECKPOINT_KEY = "dicesgd_error_feedback"
"""Key of e's tensors in the checkpoint's per-parameter optimizer state (private file)."""

_SHRINK = 1.0 - 2.0**-20
"""Scale safety factor: float32 rounding of s·e cannot make ||ψ(e)|| exceed the bound."""

_FEEDBACK_BLOCK = 1 << 24
"""Values of e taken to float64 at a time, for its norm and ψ (at most 128 MiB of float64 transients)."""

log = logging.getLogger(__name__)


class ErrorFeedbackMap(Protocol):
    """ψ: e ↦ scale(||e||)·e with ||ψ(e)|| ≤ ``norm_bound`` (C2) for every e.

    ``scale`` takes and returns a 0-dim float64 tensor on e's device: the step never waits for
    the device to hand a norm to the host (one wait per parameter tensor before, which left a GPU
    idle between the step's kernels)."""

    @property
    def norm_bound(self) -> float: ...

    def scale(self, norm: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class ErrorFeedbackClip:
    """clip(e, C2) = min(1, C2/||e||)·e; clip(0) = 0; C2 = 0 gives ψ ≡ 0 (DPSGD-GC's trajectory)."""

    threshold: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError("the error-feedback threshold must be finite and >= 0")

    @property
    def norm_bound(self) -> float:
        return self.threshold

    def scale(self, norm: torch.Tensor) -> torch.Tensor:
        return torch.where(norm <= self.threshold, 1.0, self.threshold / norm * _SHRINK)


@dataclass(frozen=True)
class ErrorFeedbackNormalise:
    """Algorithm 4's e/(||e|| + γ): norm < 1, and e = 0 maps to 0 (γ > 0, no 0/0)."""

    gamma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ValueError("gamma must be finite and > 0")

    @property
    def norm_bound(self) -> float:
        return 1.0

    def scale(self, norm: torch.Tensor) -> torch.Tensor:
        return 1.0 / (norm + self.gamma) * _SHRINK


def _flat_norm(flat: torch.Tensor) -> torch.Tensor:
    """L2 norm of a flat vector: a 0-dim float64 tensor on its device, inf or NaN if e overflowed.
    Computed on the device, never read back by the host."""
    blocks = [
        torch.linalg.vector_norm(flat[start : start + _FEEDBACK_BLOCK].detach(), dtype=torch.float64)
        for start in range(0, max(1, flat.numel()), _FEEDBACK_BLOCK)
    ]  # in float64 a block at a time: vector_norm's dtype casts its whole input first
    norm: torch.Tensor = blocks[0] if len(blocks) == 1 else torch.linalg.vector_norm(torch.stack(blocks))
    return norm


def _zero_unless(finite: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t where the 0-dim `finite` holds, else exact zeros (0·inf would be NaN)."""
    return torch.where(finite, t, 0.0)


def _flatten(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """The tensors ``names`` as one flat vector, in that order (one copy)."""
    return torch.cat([tensors[name].reshape(-1) for name in names])


def _unflatten(flat: torch.Tensor, shapes: Mapping[str, torch.Size]) -> TensorDict:
    """Views of ``flat`` shaped like ``shapes``, in order (the inverse of :func:`_flatten`)."""
    views = torch.split(flat, [math.prod(shape) for shape in shapes.values()])
    return {name: view.view(shape) for (name, shape), view in zip(shapes.items(), views, strict=True)}


def _error_dtype(tensors: Iterable[torch.Tensor]) -> torch.dtype:
    """e's one dtype: at least float32 (it accumulates), wide enough for every parameter's."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _feedback_flat(feedback_map: ErrorFeedbackMap, flat: torch.Tensor) -> torch.Tensor:
    """ψ(e) for a flat e, with ||ψ(e)|| ≤ feedback_map.norm_bound (0 if ||e|| is not finite)."""
    norm = _flat_norm(flat)
    finite, scale = torch.isfinite(norm), feedback_map.scale(norm)
    smallest_normal = torch.finfo(flat.dtype).tiny
    feedback = torch.empty_like(flat)
    for start in range(0, flat.numel(), _FEEDBACK_BLOCK):  # float64 a block at a time, not a model's worth
        block = slice(start, start + _FEEDBACK_BLOCK)
        product = flat[block].double() * scale
        # Below e's smallest normal value, rounding to e's dtype can grow a value by far more than
        # the shrink covers (up to 2× on float32's subnormal grid): such values become 0.
        keep = finite & (product.abs() >= smallest_normal)
        feedback[block] = torch.where(keep, product, 0.0)
    return feedback


def apply_feedback_map(feedback_map: ErrorFeedbackMap, error: Mapping[str, torch.Tensor]) -> TensorDict:
    """ψ(e) with ||ψ(e)|| ≤ feedback_map.norm_bound guaranteed (0 if ||e|| is not finite)."""
    flat = _flatten(error, list(error))
    feedback = _unflatten(_feedback_flat(feedback_map, flat), {name: e.shape for name, e in error.items()})
    return {name: value.to(error[name].dtype) for name, value in feedback.items()}


@dataclass(frozen=True)
class _Residual:
    """Weights 1 − w_i of the clipping residual Σ(1 − w_i)·g_i, for either engine.

    Not a per-sample map with a bound: the residual is hidden state and is never released, so
    ``norm_bound`` is infinite on purpose (nothing may use it as a sensitivity).
    """

    base: PerSampleMap

    @property
    def norm_bound(self) -> float:
        return math.inf

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return 1.0 - self.base.scale_factors(norms)


class ErrorFeedbackAggregator(BatchAggregator):
    """The DiceSGD step's data part for ``train_dp_sgd``; owns the hidden error-feedback state.

    ``sensitivity`` is the sum-scale add/remove bound Δ_sum = C1 + 2·B·C2 (B·(C1/B + 2·C2),
    algorithms.dicesgd.definition), so the loop's noise N(0, (σ·Δ_sum)²)/B is σ·Δ on the average.
    """

    def __init__(
        self,
        *,
        per_sample_map: PerSampleMap,
        feedback_map: ErrorFeedbackMap,
        expected_batch_size: float,
        engine: Engine = "auto",
    ) -> None:
        check_engine(engine)
        if not (math.isfinite(expected_batch_size) and expected_batch_size > 0):
            raise ValueError("expected_batch_size must be finite and > 0")
        self.per_sample_map = per_sample_map
        self.feedback_map = feedback_map
        self.expected_batch_size = float(expected_batch_size)
        self.engine = engine
        self._error: torch.Tensor | None = None
        """e as ONE flat vector (parameter order): the step's ψ, norms and update are a few
        kernels, not a few per parameter tensor; ``error`` gives views of it by name."""
        self._shapes: dict[str, torch.Size] = {}

    @property
    def sensitivity(self) -> float:
        return self.per_sample_map.norm_bound + 2.0 * self.expected_batch_size * self.feedback_map.norm_bound

    # -------------------------------------------------------------- hidden state (checkpoints)

    @property
    def error(self) -> TensorDict | None:
        """e by parameter name (views of the flat state), or None before the first step."""
        return None if self._error is None else _unflatten(self._error, self._shapes)

    @error.setter
    def error(self, value: Mapping[str, torch.Tensor] | None) -> None:
        if value is None:
            self._error, self._shapes = None, {}
            return
        dtype = _error_dtype(value.values())
        self._shapes = {name: e.shape for name, e in value.items()}
        self._error = _flatten({name: e.to(dtype) for name, e in value.items()}, list(value)).clone()

    def _ensure_error(self, params: Mapping[str, nn.Parameter]) -> torch.Tensor:
        """The flat e on the parameters' device (zeros at the first step)."""
        if self._error is None:
            self.error = {name: torch.zeros(p.shape, device=p.device, dtype=p.dtype) for name, p in params.items()}
        assert self._error is not None
        if list(self._shapes) != list(params) or any(self._shapes[name] != p.shape for name, p in params.items()):
            raise ValueError("the error-feedback state does not match the model's parameters")
        device = next(iter(params.values())).device
        self._error = self._error.to(device)  # after model.to()
        return self._error

    def state_dict(self) -> TensorDict:
        """Detached CPU copies of e (SECRET: for the worker's private checkpoint only)."""
        error = self.error
        if error is None:
            return {}
        return {name: e.detach().to("cpu", copy=True) for name, e in error.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], model: nn.Module) -> None:
        params = trainable_parameters(model)
        if set(state) != set(params) or any(state[name].shape != p.shape for name, p in params.items()):
            raise ValueError("the saved error-feedback state does not match the model's parameters")
        dtype = _error_dtype(params.values())
        self.error = {name: state[name].to(device=p.device, dtype=dtype) for name, p in params.items()}

    # -------------------------------------------------------------- one step

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        """Σ_i φ(g_i) + B·ψ(e_t), and e ← e_t − ψ(e_t) + Σ_i (1 − w_i)·g_i / B (module doc)."""
        params = trainable_parameters(model)
        error = self._ensure_error(params)
        names = list(params)
        if uses_ghost(model, self.engine):
            mapped, rest = ghost_weighted_grad_sums(
                model,
                X,
                y,
                loss=context.loss,
                max_physical_batch_size=context.max_physical_batch_size,
                per_sample_maps=(self.per_sample_map, _Residual(self.per_sample_map)),
            )
        else:
            # ONE pass of the materialising engine: a 2×m contraction per chunk
            mapped = zeros_like_trainable(model)
            rest = {name: torch.zeros(p.shape, dtype=error.dtype, device=error.device) for name, p in params.items()}
            weighted_grad_sums(
                (mapped, rest),
                model,
                X,
                y,
                loss=context.loss,
                weights=(self.per_sample_map.scale_factors, _Residual(self.per_sample_map).scale_factors),
                max_physical_batch_size=context.max_physical_batch_size,
            )
        with torch.no_grad():  # flat: a few kernels per step whatever the number of tensors
            dtypes = {name: t.dtype for name, t in mapped.items()}
            released, residual = _flatten(mapped, names), _flatten(rest, names).to(error.dtype)
            del mapped, rest  # their flat copies replace them
            batch = self.expected_batch_size
            feedback = _feedback_flat(self.feedback_map, error)
            released.add_(feedback.to(released.dtype), alpha=batch)
            updated = error.sub(feedback).add_(residual, alpha=1.0 / batch)
            del feedback, residual
            self._error = _zero_unless(torch.isfinite(_flat_norm(updated)), updated)  # no wait for the host
        return {name: v.to(dtypes[name]) for name, v in _unflatten(released, self._shapes).items()}


# ----------------------------------------------------------------------------- checkpoints


def with_error_feedback_in_checkpoints(
    hooks: TrainingHooks, aggregator: ErrorFeedbackAggregator, model: nn.Module
) -> TrainingHooks:
    """Hooks whose checkpoints also carry e, under the optimizer's per-parameter state.

    Parameter i of ``trainable_parameters(model)`` is optimizer index i (the loop builds its
    optimizer from that list), so the checkpoint writer stores e as ``optimizer/i/<key>``.
    """
    save = hooks.save_checkpoint
    if save is None:
        return hooks
    names = list(trainable_parameters(model))

    def save_with_error(state: TrainingState) -> None:
        per_param = state.optimizer_state.setdefault("state", {})  # the snapshot's own copy
        assert isinstance(per_param, dict)
        error = aggregator.state_dict()
        for index, name in enumerate(names):
            if name in error:
                per_param.setdefault(index, {})[ERROR_FEEDBACK_CHECKPOINT_KEY] = error[name]
        save(state)

    return dataclasses.replace(hooks, save_checkpoint=save_with_error)


def split_error_feedback(state: TrainingState, model: nn.Module) -> tuple[TrainingState, TensorDict | None]:
    """(the state without e, e by parameter name) — e is None in a checkpoint that has none."""
    names = list(trainable_parameters(model))
    optimizer_state = copy.copy(state.optimizer_state)
    per_param = optimizer_state.get("state", {})
    assert isinstance(per_param, Mapping)
    cleaned: dict[int, dict[str, object]] = {}
    error: TensorDict = {}
    for index, entries in per_param.items():
        entries = dict(entries)
        saved = entries.pop(ERROR_FEEDBACK_CHECKPOINT_KEY, None)
        if saved is not None:
            error[names[int(index)]] = saved
        if entries:
            cleaned[index] = entries
    optimizer_state["state"] = cleaned
    return dataclasses.replace(state, optimizer_state=optimizer_state), (error or None)


# ----------------------------------------------------------------------------- the loop


def train_dicesgd(
    model: nn.Module,
    X: torch.Tensor | Rows,
    y: torch.Tensor,
    *,
    config: DPSGDConfig,
    aggregator: ErrorFeedbackAggregator,
    generator: SecureRandom,
    hooks: TrainingHooks | None = None,
    resume_from: TrainingState | None = None,
    device: torch.device | None = None,
    units: UnitIndex | None = None,
    rows_per_unit: int | None = None,
) -> TrainingResult:
    """DiceSGD through the shared DP loop, with e checkpointed and restored alongside it. With
    ``units`` (a dataset with a privacy unit column) the loop samples units and each sampled
    unit's mean gradient over ``rows_per_unit`` row slots is clipped, and fed back, as one sample.

    ``config.noise_multiplier`` is σ (noise std on the average / Δ); the loop draws
    N(0, (σ·aggregator.sensitivity)² I) on the sum and divides by ``config.expected_batch_size``,
    which must be the aggregator's B. A resumed run continues bit-for-bit (e included).
    """
    if config.expected_batch_size != aggregator.expected_batch_size:
        raise ValueError("the loop's normaliser must be the aggregator's expected batch size B")
    hooks = hooks if hooks is not None else TrainingHooks()
    if resume_from is not None:
        resume_from, saved = split_error_feedback(resume_from, model)
        if saved is not None:
            aggregator.load_state_dict(saved, model)
        elif resume_from.step > 0:
            # Only a checkpoint from another writer lacks e; restarting it at 0 is privacy-neutral
            # (ψ stays bounded) and changes the algorithm only, so say so without any value.
            log.warning("DiceSGD resumed from a checkpoint without error feedback; e restarts at 0")
    loop_aggregator, sampling = unit_sampling(aggregator, units, rows_per_unit=rows_per_unit)
    return train_dp_sgd(
        model,
        X,
        y,
        config=config,
        generator=generator,
        hooks=with_error_feedback_in_checkpoints(hooks, aggregator, model),
        resume_from=resume_from,
        device=device,
        aggregator=loop_aggregator,
        units=sampling,
    )
