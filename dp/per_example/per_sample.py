"""Per-sample gradient engine: the primitive every first-order DP algorithm is built on.

How: `torch.func` — `vmap(grad(loss_of_one_row))` over a chunk of rows, each row evaluated as a
batch of one through `functional_call`. Why this and not Opacus' hooks:

- It is exact for any layer whose forward treats rows independently (GroupNorm and LayerNorm
  included), with no per-layer gradient formulas to keep correct and no wrapping or mutation of
  the caller's module.
- Chunking is natural: rows are processed `max_physical_batch_size` at a time, so memory is
  bounded by one chunk's per-sample gradients (chunk × number of parameters) however large the
  expected batch q·n is.
- It is device-agnostic: the chunk is moved to the parameters' device; nothing else changes.

Per-sample maps (clipping) act on the flat L2 norm over ALL trainable parameters jointly and
are pluggable through the `PerSampleMap` protocol (Abadi clipping now; Auto-S, PSAC, ... later).
The norm is accumulated in float64 into an upper bound and each map clips to C·(1 − κ), so that
every clipped row's vector, as computed, has norm ≤ C: the proof is in dp/per_example/clip_margin.py.

Only modules in `SUPPORTED_MODULES` are allowed. BatchNorm is refused: its batch statistics mix
rows (per-sample gradients would no longer be per-sample) and its running buffers would be
updated from private data outside any mechanism.

Mixed precision (`precision="bf16"`, dp/precision.py): each row's forward runs
under bf16 autocast inside the vmapped function, its output is cast back to float32 before the
loss, and autograd returns the per-sample gradients in the parameters' dtype (float32: the
backward of autocast's cast of a float32 parameter is a cast back). Norms, scales and the sum
are then computed from those very float32 tensors, so the norm that scales row i is the norm of
the contribution added for row i: consistent by construction, as in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dp.losses import LossSpec, get_loss, prepare_targets
from dp.per_example.clip_margin import clip_target, norm_upper_bound, sum_of_squares
from dp.precision import (
    Precision,
    autocast_context,
    check_no_outer_autocast,
    check_precision,
    check_precision_parameters,
)

__all__ = [
    "SUPPORTED_MODULES",
    "AbadiClip",
    "PerSampleMap",
    "RowWeights",
    "TensorDict",
    "add_weighted_rows",
    "check_supported",
    "chunk_placement",
    "clipped_grad_sum",
    "iter_per_sample_grads",
    "per_sample_norms",
    "physical_chunks",
    "rows_where",
    "supported_module",
    "supported_subtree",
    "trainable_parameters",
    "weighted_grad_sums",
    "zeros_like_trainable",
]

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])

# Row-wise layers without parameters: activations, pooling and reshaping within a row.
PARAMETER_FREE_MODULES: frozenset[type[nn.Module]] = frozenset(
    {
        nn.Identity,
        nn.Flatten,
        nn.Unflatten,
        nn.Tanh,
        nn.ReLU,
        nn.GELU,
        nn.SiLU,
        nn.Sigmoid,
        nn.ELU,
        nn.LeakyReLU,
        nn.MaxPool1d,
        nn.MaxPool2d,
        nn.AvgPool1d,
        nn.AvgPool2d,
        nn.AdaptiveAvgPool1d,
        nn.AdaptiveAvgPool2d,
    }
)

# Exact types (not subclasses): a subclass may override forward with something row-mixing.
SUPPORTED_MODULES: set[type[nn.Module]] = {
    nn.Sequential,
    nn.ModuleList,
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Embedding,
    *PARAMETER_FREE_MODULES,
}


def supported_module(cls: ModuleT) -> ModuleT:
    """Class decorator for zoo-internal container modules (e.g. a residual block).

    Register a class only if its forward treats rows independently, draws no randomness and
    mutates no buffers; its children are checked separately.
    """
    SUPPORTED_MODULES.add(cls)
    return cls


SUPPORTED_SUBTREES: set[type[nn.Module]] = set()


def supported_subtree(cls: ModuleT) -> ModuleT:
    """Class decorator for a container whose whole forward, its descendants' included, treats rows
    independently, draws no randomness and mutates no buffers (e.g. the zoo's ``HFModel``, whose
    Transformers modules are built with dropout 0 and a per-row attention mask).

    Its descendants are not checked type by type, since torch.func differentiates any forward
    exactly; BatchNorm inside it is still refused. A random operation inside it fails loudly:
    vmap runs in its "error" randomness mode.
    """
    SUPPORTED_SUBTREES.add(cls)
    return cls


def _inside_subtree(name: str, subtrees: list[str]) -> bool:
    return any(name.startswith(f"{root}.") or not root for root in subtrees)


def check_supported(model: nn.Module) -> None:
    """Raise ValueError if `model` contains a module the engine cannot make per-sample."""
    subtrees: list[str] = []
    for name, module in model.named_modules():
        where = name or "<root>"
        inside = _inside_subtree(name, subtrees)
        if type(module) in SUPPORTED_SUBTREES and not inside:
            subtrees.append(name)
            continue
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"module {where} is {type(module).__name__}: BatchNorm mixes samples and is not "
                "supported with DP; use GroupNorm"
            )
        if type(module) not in SUPPORTED_MODULES and not inside:
            raise ValueError(
                f"module {where} of type {type(module).__name__} is not supported by the per-sample gradient engine"
            )


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters DP training updates, in `model.named_parameters()` order."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def zeros_like_trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    """A zero accumulator per trainable parameter (contiguous, the parameter's dtype and device)."""
    return {
        name: torch.zeros_like(p, memory_format=torch.contiguous_format)
        for name, p in trainable_parameters(model).items()
    }


class PerSampleMap(Protocol):
    """Maps per-sample gradient norms to per-sample scale factors: g_i -> scale_i · g_i.

    `norm_bound` is S, a bound on ||scale_i · g_i|| for every possible g_i: the add/remove L2
    sensitivity of the sum of mapped gradients, hence the noise std is σ·S.
    """

    @property
    def norm_bound(self) -> float: ...

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class AbadiClip:
    """Abadi et al. (2016) clipping: g · min(1, C/||g||); S = C."""

    clipping_norm: float

    def __post_init__(self) -> None:
        if not (self.clipping_norm > 0 and self.clipping_norm < float("inf")):
            raise ValueError(f"clipping_norm must be positive and finite, got {self.clipping_norm}")

    @property
    def norm_bound(self) -> float:
        return self.clipping_norm

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        # where() rather than clamp(C / (norm + eps)): rows already within the target stay
        # bit-identical. The target is C·(1 − κ), so that the rounded result stays within C
        # (dp/per_example/clip_margin.py); norm_bound, the charged sensitivity, is C.
        c = clip_target(self.clipping_norm, norms.dtype)
        return torch.where(norms > c, c / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)


TensorDict = dict[str, torch.Tensor]
BatchedGradFn = Callable[[TensorDict, TensorDict, torch.Tensor, torch.Tensor], TensorDict]


def _batched_grad_fn(
    model: nn.Module, loss: str, *, precision: Precision, device_type: str, dtype: torch.dtype
) -> BatchedGradFn:
    """vmap(grad) of one row's loss; the forward under `precision`'s autocast, the loss in `dtype`
    (the parameters': a no-op cast under fp32)."""
    spec = get_loss(loss)

    def loss_of_one(
        params: dict[str, torch.Tensor],
        buffers: dict[str, torch.Tensor],
        x: torch.Tensor,
        target: torch.Tensor,
    ) -> torch.Tensor:
        with autocast_context(precision, device_type=device_type):
            outputs = functional_call(model, (params, buffers), (x.unsqueeze(0),))
        return spec.fn(outputs.to(dtype), target.unsqueeze(0))

    return vmap(grad(loss_of_one), in_dims=(None, None, 0, 0))


def iter_per_sample_grads(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield per-sample gradients chunk by chunk: name -> tensor of shape (m, *param.shape).

    Rows of X/y may live on any device; each chunk is moved to the parameters' device. Yields
    nothing for an empty batch. The caller must drop each chunk before the next to keep memory
    bounded (algorithms needing two passes over a batch simply iterate twice). Under `precision`
    "bf16" the forward runs under bf16 autocast (float32 parameters required; a caller's own
    autocast region is refused); the gradients are float32 either way.
    """
    if max_physical_batch_size < 1:
        raise ValueError(f"max_physical_batch_size must be >= 1, got {max_physical_batch_size}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    check_precision(precision)
    check_supported(model)
    params = {name: p.detach() for name, p in trainable_parameters(model).items()}
    device, dtype = chunk_placement(params, precision)
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    spec = get_loss(loss)
    per_sample_grad = _batched_grad_fn(model, loss, precision=precision, device_type=device.type, dtype=dtype)
    for x, target in physical_chunks(X, y, spec=spec, rows=max_physical_batch_size, device=device, dtype=dtype):
        yield per_sample_grad(params, buffers, x, target)


def chunk_placement(params: Mapping[str, torch.Tensor], precision: Precision) -> tuple[torch.device, torch.dtype]:
    """Where both engines put their chunks: the trainable parameters' device and dtype, once there
    are parameters and they suit ``precision`` (bf16 needs float32 parameters, and no autocast
    region of the caller's may be active)."""
    if not params:
        raise ValueError("model has no trainable parameters")
    check_precision_parameters(precision, params.values())
    first = next(iter(params.values()))
    check_no_outer_autocast(first.device.type)
    return first.device, first.dtype


def physical_chunks(
    X: torch.Tensor, y: torch.Tensor, *, spec: LossSpec, rows: int, device: torch.device, dtype: torch.dtype
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(rows, targets) of each chunk of ``rows`` rows, moved to ``device``, floating values in
    ``dtype`` (the parameters'): the chunking of both per-sample engines. Chunks bound memory
    only; every row is in exactly one, in order."""
    for start in range(0, X.shape[0], rows):
        x = X[start : start + rows].to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        yield x, prepare_targets(spec, y[start : start + rows].to(device), dtype=dtype)


def per_sample_norms(grads: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Flat L2 norm of each row's gradient across all parameter tensors jointly: shape (m,), in
    the gradients' dtype: accumulated in float64 and raised to an upper bound on the exact norm
    (dp/per_example/clip_margin.py; by at most 2⁻²⁰ relative, ~1e-10 for a million values)."""
    first = next(iter(grads.values()))
    terms = sum(g[0].numel() for g in grads.values()) + len(grads)
    squares = torch.stack([sum_of_squares(g) for g in grads.values()]).sum(dim=0)
    return norm_upper_bound(squares, terms=terms, dtype=first.dtype)


RowWeights = Callable[[torch.Tensor], torch.Tensor]
"""Per-sample norms (m,) -> per-sample weights (m,): a map's ``scale_factors``, or any rule of a row's norm."""


def rows_where(keep: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``g`` (m, ...) with the rows where ``keep`` (m,) is False set to exactly 0."""
    return torch.where(keep.view(-1, *[1] * (g.dim() - 1)), g, 0.0)


def add_weighted_rows(
    totals: Sequence[Mapping[str, torch.Tensor]],
    grads: Mapping[str, torch.Tensor],
    weights: Sequence[RowWeights],
) -> None:
    """``totals[k] += Σ_i weights[k](‖g_i‖)_i · g_i`` for one chunk of per-sample gradients.

    The clipped-sum step of every algorithm that bounds materialised per-sample gradients (a map,
    DC-DPSGD's split, DiceSGD's residual, KL-Spider's differences), written once. ‖g_i‖ is
    `per_sample_norms` (flat over all parameters). A row whose norm is not finite (overflow, NaN)
    gets weight 0 in every sum and is zeroed before the contraction (0·inf would be NaN), so it
    contributes exactly 0: otherwise whether the released model is NaN would reveal whether that
    row was sampled; 0 stays within every bound. Checking whether any row is non-finite is the
    chunk's one host synchronisation (cheaper than masking every operand). Several weightings
    share one (k, m) contraction per tensor; each total keeps its own dtype.
    """
    norms = per_sample_norms(grads)
    finite = torch.isfinite(norms)
    each = [torch.where(finite, weight(norms), 0.0) for weight in weights]
    if not bool(finite.all()):
        grads = {name: rows_where(finite, g) for name, g in grads.items()}
    if len(each) == 1:
        (total,), (scale,) = totals, each
        for name, g in grads.items():
            total[name].add_(torch.tensordot(scale, g, dims=1))
        return
    stacked = torch.stack(each)  # (k, m)
    for name, g in grads.items():
        sums = torch.tensordot(stacked.to(g.dtype), g, dims=1)
        for total, weighted in zip(totals, sums, strict=True):
            total[name].add_(weighted.to(total[name].dtype))


def weighted_grad_sums(
    totals: Sequence[Mapping[str, torch.Tensor]],
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    weights: Sequence[RowWeights],
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> None:
    """``totals[k] += Σ_i weights[k](‖g_i‖)·g_i`` over the rows of (X, y), chunk by chunk
    (`add_weighted_rows`): one pass of the vmap engine for every weighting. Private results."""
    with torch.no_grad():
        for grads in iter_per_sample_grads(
            model, X, y, loss=loss, max_physical_batch_size=max_physical_batch_size, precision=precision
        ):
            add_weighted_rows(totals, grads, weights)


def clipped_grad_sum(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    per_sample_map: PerSampleMap,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> dict[str, torch.Tensor]:
    """Σ_i scale_i · g_i over the rows of (X, y), for every trainable parameter.

    Returns name -> tensor of the parameter's shape, on the parameter's device (zeros for an
    empty batch). The result is private: only ever release it through a noise mechanism.
    `precision`: "bf16" runs each forward under bf16 autocast; norms and the sum stay float32.
    A row whose gradient is not finite contributes exactly zero (`add_weighted_rows`); mapping
    such a row to 0 stays within the map's norm bound.
    """
    total = zeros_like_trainable(model)
    weighted_grad_sums(
        (total,),
        model,
        X,
        y,
        loss=loss,
        weights=(per_sample_map.scale_factors,),
        max_physical_batch_size=max_physical_batch_size,
        precision=precision,
    )
    return total
