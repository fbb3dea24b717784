"""Ghost rules for the Hugging Face Transformers layers with parameters that torch has no class for.

- GPT-2's ``Conv1D``: y = x W + b with W of shape (in, out), i.e. a Linear whose weight is stored
  transposed. Its rule is the Linear rule (`linear_conv.dense_calls_work`, same forms, same norms:
  a transpose changes no norm) with the weight's per-sample gradients and weighted sums
  transposed into (in, out) on the way out.
- ``LlamaRMSNorm`` and ``Qwen2RMSNorm``: y = weight ⊙ x̂, x̂ = x / sqrt(mean(x²) + eps) over the
  last dimension, computed in float32 and cast back to the input's dtype. Row i's gradient is
  Σ_t δ_it ⊙ x̂_it over its positions, (B, d) in all, so it is materialised (`materialised_work`),
  with x̂ recomputed from the recorded input by the same operations as the forward. Under bf16
  autocast the engine hands rules float32 inputs (engine.py), so x̂ is then not rounded to
  bfloat16 as the forward's is: that changes which gradient is clipped, never the bound.

Imported by `optional.load_optional_families` only once the process has imported Transformers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
from transformers.pytorch_utils import Conv1D

from dp.per_example.ghost.linear_conv import dense_calls_work
from dp.per_example.ghost.registry import ghost_layer, rows_on_dim0
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, Totals, materialised_work
from dp.per_example.per_sample import supported_module

__all__ = ["conv1d_work", "rms_norm_work", "rms_normalised"]


def _transposed_weight(work: LayerWork, *, weight: str | None, nf: int, nx: int) -> LayerWork:
    """`work` of a Linear (out = nf, in = nx) with the weight's results in Conv1D's (nx, nf) layout."""
    if weight is None:  # bias only: nothing to transpose
        return work

    def transpose(name: str, value: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        if name != weight:
            return value
        if rows is None:
            return value.reshape(nf, nx).T
        return value.reshape(rows, nf, nx).transpose(1, 2)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        staged = [Totals() for _ in totals]
        work.accumulate(w, mask, staged)
        for stage, total in zip(staged, totals, strict=True):
            for name, value in stage.sums.items():
                total.add(name, transpose(name, value))

    def per_sample() -> dict[str, torch.Tensor]:
        return {name: transpose(name, g, g.shape[0]) for name, g in work.per_sample().items()}

    return LayerWork(work.sq_norms, accumulate, per_sample, holds_per_sample=work.holds_per_sample)


@ghost_layer(Conv1D)
def conv1d_work(module: Conv1D, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """Conv1D on (B, k) rows or (B, *, k) sequences: the Linear rule, the weight transposed."""
    work = dense_calls_work(names, calls, out_features=module.nf, in_features=module.nx, bk=bk)
    return _transposed_weight(work, weight=names["weight"], nf=module.nf, nx=module.nx)


def rms_normalised(module: LlamaRMSNorm | Qwen2RMSNorm, a: torch.Tensor) -> torch.Tensor:
    """x̂ exactly as the layer's forward computes it before the weight: in float32, cast back."""
    hidden = a.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + module.variance_epsilon)
    return hidden.to(a.dtype)


def _rms_norm_keeps_rows(module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """(B, ..., d) in and an output of the same shape: rows on dimension 0, normalised over the last."""
    return rows_on_dim0(module, inp, out, batch) and out.shape == inp.shape


@ghost_layer(LlamaRMSNorm, keeps_rows=_rms_norm_keeps_rows, parameters=("weight",))
@ghost_layer(Qwen2RMSNorm, keeps_rows=_rms_norm_keeps_rows, parameters=("weight",))
def rms_norm_work(module: LlamaRMSNorm | Qwen2RMSNorm, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """g_i = Σ over positions of δ ⊙ x̂: (B, d); a reused layer's calls add up."""
    name = names["weight"]
    assert name is not None  # the recorder hooks only layers with a trainable parameter
    batch, features = calls[0][0].shape[0], module.weight.shape[0]
    total: torch.Tensor | None = None
    for a, d in calls:
        part = (d * rms_normalised(module, a)).reshape(batch, -1, features).sum(dim=1)
        total = part if total is None else total + part
    assert total is not None
    return materialised_work({name: total})


for _layer in (Conv1D, LlamaRMSNorm, Qwen2RMSNorm):  # plain leaves for the vmap engine (torch.func)
    supported_module(_layer)
