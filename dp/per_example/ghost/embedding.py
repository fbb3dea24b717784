"""Ghost rule for Embedding: g_i = Σ_t onehot(idx_it) δ_itᵀ over the looked-up positions t.

||g_i||² = Σ_{t,t'} [idx_it = idx_it'] δ_it·δ_it' (Gram form), or the (B, V, d) materialisation
when that costs less (flops plus the device's cost per value written, as for Linear layers).
The weighted sum is one index_add of the scaled output gradients. Calls of
a reused embedding are stacked along the position axis. Refused: max_norm (rewrites the weight
from the data) and scale_grad_by_freq (the gradient depends on the whole batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dp.per_example.clip_margin import gram_allowance
from dp.per_example.ghost.registry import ghost_layer
from dp.per_example.ghost.work import (
    MATERIALISE_MAX_ELEMENTS,
    WRITE_COST_FLOPS,
    Calls,
    LayerWork,
    ParamNames,
    Totals,
    masked_rows,
    materialised_work,
)

__all__ = ["embedding_work"]


def _keeps_rows(module: nn.Embedding, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """Indices may be (B,): one looked-up row per sample is enough."""
    return inp.dim() >= 1 and inp.shape[0] == batch and out.shape[0] == batch


def _refusal(module: nn.Embedding) -> str | None:
    if module.max_norm is not None or module.scale_grad_by_freq:
        return "uses max_norm or scale_grad_by_freq, which the ghost clipping engine does not support"
    return None


@ghost_layer(nn.Embedding, keeps_rows=_keeps_rows, refusal=_refusal)
def embedding_work(module: nn.Embedding, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    name = names["weight"]
    assert name is not None
    batch = calls[0][0].shape[0]
    dim = module.embedding_dim
    idx = torch.cat([a.reshape(batch, -1) for a, _ in calls], dim=1)  # (B, T)
    D = torch.cat([d.reshape(batch, -1, dim) for _, d in calls], dim=1)  # (B, T, d)
    if module.padding_idx is not None:  # the padding row gets no gradient
        D = D * (idx != module.padding_idx).unsqueeze(-1).to(D.dtype)
    positions, vocab = idx.shape[1], module.num_embeddings
    # Gram: T²·(d+1) flops and T² values written per row; materialised: V·d of both (zero-fill,
    # scatter, norm), each value written costing the device's WRITE_COST_FLOPS (on a CPU the Gram
    # form was 10× faster at T = 64, V = 1024, d = 256, where flops alone picked materialising).
    write = WRITE_COST_FLOPS.get(D.device.type, 0)
    gram_cost = positions * positions * (dim + 1 + write)
    gram = gram_cost <= vocab * dim * (1 + write) or batch * vocab * dim > MATERIALISE_MAX_ELEMENTS

    def materialised() -> torch.Tensor:
        G = D.new_zeros(batch, vocab, dim)
        return G.scatter_add_(1, idx.unsqueeze(-1).expand(-1, -1, dim), D)

    if not gram:
        return materialised_work({name: materialised()})
    # In float64, plus the bound on its rounding: tokens repeated in a row may cancel
    # (dp/per_example/clip_margin.py).
    D64 = D.to(torch.float64)
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(torch.float64)  # (B, T, T)
    sq = (same * torch.matmul(D64, D64.transpose(1, 2))).sum(dim=(1, 2)).clamp_min(0.0)
    weights = torch.linalg.vector_norm(D64, dim=-1).sum(dim=-1)
    sq = sq + gram_allowance(weights, terms=dim + positions * positions + 3)
    del D64

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        rows = masked_rows(mask, D)
        for total, weights in zip(totals, w, strict=True):
            total.index_add(name, module.weight, idx.reshape(-1), (rows * weights.view(-1, 1, 1)).reshape(-1, dim))

    return LayerWork(sq, accumulate, lambda: {name: materialised()})
