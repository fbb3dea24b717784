"""Ghost rules for the ViT's bare parameters: the class token and the positional embedding.

`TokenPrepend` puts one learned token in front of each sequence, so row i's gradient is the
output gradient at position 0, δ_i0 (d values). `PositionalEmbedding` adds a learned (T, d)
tensor to each sequence, so row i's gradient is its whole output gradient δ_i. Both are small
(at most T·d per row), so they are materialised and handed to `materialised_work`; calls of a
reused module add up.
"""

from __future__ import annotations

import torch
from torch import nn

from dp.per_example.ghost.registry import ghost_layer, rows_on_dim0
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, materialised_work
from privtrain_common.zoo.architectures import PositionalEmbedding, TokenPrepend

__all__ = ["positional_embedding_work", "token_prepend_work"]


def _sequences(module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """(B, T, d) in and out: rows on dimension 0."""
    return rows_on_dim0(module, inp, out, batch) and inp.dim() == 3 and out.dim() == 3


def _summed(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


@ghost_layer(TokenPrepend, keeps_rows=_sequences, parameters=("token",))
def token_prepend_work(module: TokenPrepend, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """g_i = δ_i0, the output gradient at the prepended position."""
    name = names["token"]
    assert name is not None  # the recorder hooks only layers with a trainable parameter
    return materialised_work({name: _summed([d[:, 0, :] for _, d in calls])})


@ghost_layer(PositionalEmbedding, keeps_rows=_sequences, parameters=("embedding",))
def positional_embedding_work(module: PositionalEmbedding, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """g_i = δ_i, the whole (T, d) output gradient."""
    name = names["embedding"]
    assert name is not None
    return materialised_work({name: _summed([d for _, d in calls])})
