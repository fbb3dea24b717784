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

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dp.losses import get_loss, prepare_targets
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
    "check_supported",
    "clipped_grad_sum",
    "iter_per_sample_grads",
    "per_sample_norms",
    "supported_module",
    "trainable_parameters",
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


def check_supported(model: nn.Module) -> None:
    """Raise ValueError if `model` contains a module the engine cannot make per-sample."""
    for name, module in model.named_modules():
        where = name or "<root>"
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"module {where} is {type(module).__name__}: BatchNorm mixes samples and is not "
                "supported with DP; use GroupNorm"
            )
        if type(module) not in SUPPORTED_MODULES:
            raise ValueError(
                f"module {where} of type {type(module).__name__} is not supported by the per-sample gradient engine"
            )


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters DP training updates, in `model.named_parameters()` order."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


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
    if not params:
        raise ValueError("model has no trainable parameters")
    check_precision_parameters(precision, params.values())
    first = next(iter(params.values()))
    device, dtype = first.device, first.dtype
    check_no_outer_autocast(device.type)
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    spec = get_loss(loss)
    per_sample_grad = _batched_grad_fn(model, loss, precision=precision, device_type=device.type, dtype=dtype)
    for start in range(0, X.shape[0], max_physical_batch_size):
        x = X[start : start + max_physical_batch_size].to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        target = prepare_targets(spec, y[start : start + max_physical_batch_size].to(device), dtype=dtype)
        yield per_sample_grad(params, buffers, x, target)


def per_sample_norms(grads: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Flat L2 norm of each row's gradient across all parameter tensors jointly: shape (m,), in
    the gradients' dtype: accumulated in float64 and raised to an upper bound on the exact norm
    (dp/per_example/clip_margin.py; by at most 2⁻²⁰ relative, ~1e-10 for a million values)."""
    first = next(iter(grads.values()))
    terms = sum(g[0].numel() for g in grads.values()) + len(grads)
    squares = torch.stack([sum_of_squares(g) for g in grads.values()]).sum(dim=0)
    return norm_upper_bound(squares, terms=terms, dtype=first.dtype)


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

    A row whose gradient is not finite (overflow, NaN) contributes exactly zero instead of
    poisoning the sum: otherwise whether the released model is NaN would reveal whether that
    row was sampled. Mapping such a row to 0 stays within the map's norm bound.
    """
    total = {
        name: torch.zeros_like(p, memory_format=torch.contiguous_format)
        for name, p in trainable_parameters(model).items()
    }
    with torch.no_grad():
        for grads in iter_per_sample_grads(
            model, X, y, loss=loss, max_physical_batch_size=max_physical_batch_size, precision=precision
        ):
            norms = per_sample_norms(grads)
            finite = torch.isfinite(norms)
            scale = torch.where(finite, per_sample_map.scale_factors(norms), 0.0)
            if not bool(finite.all()):
                grads = {name: torch.where(finite.view(-1, *[1] * (g.dim() - 1)), g, 0.0) for name, g in grads.items()}
            for name, g in grads.items():
                total[name].add_(torch.tensordot(scale, g, dims=1))
    return total
