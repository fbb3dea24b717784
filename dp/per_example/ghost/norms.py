"""Ghost rules for GroupNorm and LayerNorm: exact per-sample gradients, only (B, C)-sized.

The weight's per-sample gradient is Σ over positions of δ·x̂, the bias's Σ of δ, with x̂ the
normalised input recomputed from the recorded input (no affine part). Calls of a reused layer
have their per-sample gradients summed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dp.per_example.ghost.registry import ghost_layer, rows_on_dim0
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, materialised_work

__all__ = ["group_norm_work", "layer_norm_work"]

# reduce(t, batch): sum a (B, ...) tensor over positions to the parameter's per-sample shape.
Reduce = Callable[[torch.Tensor, int], torch.Tensor]


def _affine_work(
    names: ParamNames,
    calls: Calls,
    *,
    normalise: Callable[[torch.Tensor], torch.Tensor],
    reduce: Reduce,
) -> LayerWork:
    """Per-sample gradients of an affine transform y = x̂·weight + bias applied per position."""
    gw: torch.Tensor | None = None
    gb: torch.Tensor | None = None
    for a, d in calls:
        batch = a.shape[0]
        xhat = normalise(a) if names["weight"] is not None else None
        if xhat is not None:
            w_part = reduce(d * xhat, batch)
            gw = w_part if gw is None else gw + w_part
        if names["bias"] is not None:
            b_part = reduce(d, batch)
            gb = b_part if gb is None else gb + b_part
    grads = {n: g for n, g in ((names["weight"], gw), (names["bias"], gb)) if n is not None and g is not None}
    return materialised_work(grads)


@ghost_layer(nn.GroupNorm)
def group_norm_work(module: nn.GroupNorm, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """(B, C, *) -> sum over positions -> (B, C)."""

    def normalise(a: torch.Tensor) -> torch.Tensor:
        return F.group_norm(a, module.num_groups, eps=module.eps)

    def reduce(t: torch.Tensor, batch: int) -> torch.Tensor:
        return t.reshape(batch, module.num_channels, -1).sum(dim=2)

    return _affine_work(names, calls, normalise=normalise, reduce=reduce)


def _layer_norm_keeps_rows(module: nn.LayerNorm, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """Rows on dimension 0 and at least one dimension in front of the normalised shape."""
    return rows_on_dim0(module, inp, out, batch) and inp.dim() > len(module.normalized_shape)


@ghost_layer(nn.LayerNorm, keeps_rows=_layer_norm_keeps_rows)
def layer_norm_work(module: nn.LayerNorm, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """(B, *, *normalized_shape) -> sum over the middle positions -> (B, *normalized_shape)."""
    shape = tuple(module.normalized_shape)

    def normalise(a: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(a, shape, eps=module.eps)

    def reduce(t: torch.Tensor, batch: int) -> torch.Tensor:
        return t.reshape(batch, -1, *shape).sum(dim=1)

    return _affine_work(names, calls, normalise=normalise, reduce=reduce)
