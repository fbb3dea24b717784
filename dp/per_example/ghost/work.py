"""What a per-layer rule hands the engine: a layer's per-sample squared norms and its weighted sum.

Every layer family (linear_conv, norms, embedding, ...) turns the recorded calls of one layer —
(detached input a, output gradient δ) per call, rows on dimension 0 — into a `LayerWork`. The
engine adds the `sq_norms` of all layers (float64) into the joint flat norm, derives per-row scales from it,
then asks each layer to `accumulate` Σ_i scale_i·g_i into the running `Totals`. Algorithms that
need each row's gradient itself (DC-DPSGD projects it) ask the layer for `per_sample` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from dp.per_example.clip_margin import sum_of_squares

__all__ = [
    "MATERIALISE_MAX_ELEMENTS",
    "WRITE_COST_FLOPS",
    "Accumulate",
    "Calls",
    "LayerWork",
    "ParamNames",
    "PerSample",
    "Totals",
    "masked_rows",
    "materialised_work",
    "squared_norm",
]

WRITE_COST_FLOPS: dict[str, int] = {"cpu": 128, "cuda": 128}
"""Device type -> flops that one value a form writes (and keeps) costs, in the rules' choice between
a Gram form and materialised per-sample gradients (0 where absent: flops alone). A Linear or Conv
layer materialising writes o·k values per row in GEMMs whose inner dimension is only T, keeps them
until the scales are known and reads them twice more; its Gram form writes 2·T². An Embedding
materialising writes V·d per row.

CPU: per-layer timings alone picked 32, but whole clipped-sum steps of the zoo
(bench/gram_choice.py --whole-steps) take the same time at 128 within this machine's noise (cnn
32-64-128 about 6% longer), and at 128 the ViT's and the transformers' Linear layers keep their
inputs and output gradients instead of o·k values per row: at B = 32 their steps' peak memory
went from 1.85× and 1.55× to 1.38× and 1.21× the non-private peak
(docs/benchmarks.md#whole-steps-per-write-cost). CUDA: the same value until
`bench.gram_choice --device cuda --whole-steps` has measured it; a GPU moves fewer bytes per flop
than a CPU, so writing and re-reading a value costs at least as many flops there."""

# Materialising per-sample weight gradients of one layer costs chunk × |W| elements; above this
# many elements the Gram form is used when it needs less memory (float32: 4 bytes each).
MATERIALISE_MAX_ELEMENTS = 1 << 26

# One layer's recorded calls in one chunk: (detached input, gradient of the loss w.r.t. the output).
Calls = Sequence[tuple[torch.Tensor, torch.Tensor]]

# The layer's parameter attribute ("weight", "bias", ...) -> its name in the model's trainable
# parameters, or None when the attribute is absent or frozen (it then gets no gradient).
ParamNames = dict[str, str | None]


class Totals:
    """Running sums per parameter name. The first contribution is kept as it is (it is always a
    freshly computed tensor), which saves a zero-fill and an add per parameter and chunk."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        current = self.sums.get(name)
        if current is None:
            self.sums[name] = value
        else:
            current.add_(value)

    def index_add(self, name: str, like: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> None:
        current = self.sums.get(name)
        if current is None:
            current = self.sums[name] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        current.index_add_(0, index, source)

    def result(self, params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
        """name -> sum with the parameter's shape, in parameter order (zeros if never added)."""
        out = {}
        for name, p in params.items():
            value = self.sums.get(name)
            out[name] = (
                torch.zeros_like(p, memory_format=torch.contiguous_format)
                if value is None
                else value.reshape(p.shape).contiguous()
            )
        return out


# accumulate(weights (m, B), row_mask, totals (m of them)): totals[j][name] += Σ_i weights_ji·g_i for
# every weighting j, each layer's recorded tensors read once for all m (DiceSGD asks for two). row_mask
# is None when every row is finite, else a (B,) bool tensor: rows outside it must contribute exactly 0.
Accumulate = Callable[[torch.Tensor, torch.Tensor | None, Sequence[Totals]], None]

# per_sample(): the layer's per-sample gradients, parameter name -> (B, param.numel() values in the
# parameter's order, any shape), built on demand
# (a rule that already materialised them returns those tensors: callers must not modify them).
PerSample = Callable[[], dict[str, torch.Tensor]]


@dataclass
class LayerWork:
    sq_norms: torch.Tensor
    """(B,) float64: each row's squared norm of this layer's per-sample gradient, within the
    relative error of a float64 sum or above it (dp/per_example/clip_margin.py)."""
    accumulate: Accumulate
    per_sample: PerSample
    holds_per_sample: bool = False
    """per_sample() hands back gradients the work already holds (a materialised form): no new work."""


def masked_rows(mask: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """t with the rows outside `mask` set to exactly 0 (t has shape (B, ...))."""
    if mask is None:
        return t
    return torch.where(mask.view(-1, *([1] * (t.dim() - 1))), t, 0.0)


def squared_norm(t: torch.Tensor, dims: int) -> torch.Tensor:
    """Squared L2 norm over the last `dims` dimensions, accumulated in float64 (exact squares, a
    bounded relative error: dp/per_example/clip_margin.py)."""
    return sum_of_squares(t, start_dim=t.dim() - dims)


def materialised_work(grads: dict[str, torch.Tensor]) -> LayerWork:
    """Per-sample gradients already in hand (B, *param.shape): norm and tensordot."""
    sq = torch.stack([squared_norm(g.reshape(g.shape[0], -1), 1) for g in grads.values()]).sum(dim=0)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        for name, g in grads.items():
            sums = torch.tensordot(w, masked_rows(mask, g), dims=1)  # (m, *param shape): g read once
            for total, s in zip(totals, sums, strict=True):
                total.add(name, s)

    return LayerWork(sq, accumulate, lambda: grads, holds_per_sample=True)
