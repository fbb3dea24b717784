"""Tiny text models and hand-made token batches for the text-model tests (no dataset upload)."""

from __future__ import annotations

import torch
from torch import nn

from dp.losses import IGNORED_TARGET
from privtrain_common.zoo.architectures import build_model

VOCAB, PAD, LENGTH = 13, 0, 6
SIZES = {"layers": 2, "dim": 8, "heads": 2, "mlp_dim": 12}


def tokens(n: int, *, seed: int = 3) -> torch.Tensor:
    """(n, LENGTH) int64 token ids right-padded with PAD, lengths 1..LENGTH (some rows padded)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, LENGTH), generator=gen)
    lengths = torch.randint(1, LENGTH + 1, (n,), generator=gen)
    lengths[0] = LENGTH  # one full row and, below, one row of a single token
    if n > 1:
        lengths[1] = 1
    positions = torch.arange(LENGTH).unsqueeze(0)
    return torch.where(positions < lengths.unsqueeze(1), ids, torch.full_like(ids, PAD))


def lm_targets(ids: torch.Tensor) -> torch.Tensor:
    """A language model's targets as the data side gives them: the ids, padding ignored."""
    return torch.where(ids == PAD, torch.full_like(ids, IGNORED_TARGET), ids)


def text_model(
    name: str, *, n_outputs: int | None = None, seed: int = 7, dtype: torch.dtype = torch.float64, **params: object
) -> nn.Module:
    outputs = VOCAB if name == "transformer-lm" else (n_outputs or 3)
    model = build_model(
        name,
        {**SIZES, "vocab_size": VOCAB, "pad_id": PAD, **params},
        input_shape=(LENGTH,),
        n_outputs=outputs,
        generator=torch.Generator().manual_seed(seed),
    )
    return model.to(dtype)
