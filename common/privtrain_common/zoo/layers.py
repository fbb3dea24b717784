"""The zoo's own torch layers: the building blocks its image and text models share.

Each one either only calls its children (a container) or owns parameters with an exact
per-sample gradient rule in the worker's ghost engine; none mixes the rows of a batch. Their
parameter names are part of the model file format: never rename them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = [
    "TEXT_POOLINGS",
    "ZOO_CONTAINERS",
    "ZOO_LAYERS",
    "FirstToken",
    "PatchTokens",
    "PositionalEmbedding",
    "Residual",
    "SelfAttention",
    "TextTransformer",
    "TokenPrepend",
    "TransformerBlock",
    "WSConv2d",
]


def _standardise(weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero mean, unit variance per output channel (over the fan-in), as in weight standardisation."""
    dims = tuple(range(1, weight.dim()))
    mean = weight.mean(dim=dims, keepdim=True)
    var = weight.var(dim=dims, keepdim=True, unbiased=False)
    return (weight - mean) / torch.sqrt(var + eps)


class WSConv2d(nn.Conv2d):
    """Conv2d whose effective weight is the standardised raw weight (Qiao et al. 2019; De et al. 2022).

    Standardisation is a function of the parameter only, never of the data, so rows stay
    independent; the ghost engine maps the per-sample gradient of the effective weight back to
    the raw weight through the standardisation's Jacobian.
    """

    eps: float = 1e-5

    def effective_weight(self) -> torch.Tensor:
        return _standardise(self.weight, self.eps)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._conv_forward(input, self.effective_weight(), self.bias)
        return out


class Residual(nn.Module):
    """body(x) + shortcut(x): the skip connection of residual blocks (a container)."""

    def __init__(self, body: nn.Module, shortcut: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x) + self.shortcut(x)
        return out


class PatchTokens(nn.Module):
    """(B, C, H, W) -> (B, T, d): the patch embedding's feature map as a sequence of tokens."""

    def __init__(self, projection: nn.Conv2d) -> None:
        super().__init__()
        self.projection = projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens: torch.Tensor = self.projection(x).flatten(2).transpose(1, 2)
        return tokens


class TokenPrepend(nn.Module):
    """Prepends one learned token (the class token) to every sequence: (B, T, d) -> (B, T+1, d)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.normal_(self.token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.token.expand(x.shape[0], -1, -1), x], dim=1)


class PositionalEmbedding(nn.Module):
    """Adds a learned embedding per position: (B, T, d) -> (B, T, d)."""

    def __init__(self, positions: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.zeros(1, positions, dim))
        nn.init.normal_(self.embedding, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.embedding


class SelfAttention(nn.Module):
    """Multi-head self-attention from four Linear layers (q, k, v, out) applied per position.

    Written out instead of nn.MultiheadAttention so that every parameter belongs to a Linear,
    which both per-sample gradient engines handle exactly. Attention mixes positions, never rows.
    """

    def __init__(self, dim: int, heads: int, *, causal: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"attention dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.causal = causal
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        batch, positions, dim = t.shape
        return t.reshape(batch, positions, self.heads, dim // self.heads).transpose(1, 2)

    def _allowed(self, key_mask: torch.Tensor | None, positions: int, device: torch.device) -> torch.Tensor | None:
        """Which keys each query may look at, broadcastable to (B, heads, T, T); None: all of them."""
        allowed: torch.Tensor | None = None
        if key_mask is not None:
            allowed = key_mask[:, None, None, :]  # (B, 1, 1, T): padding is never looked at
        if self.causal:
            earlier = torch.ones(positions, positions, dtype=torch.bool, device=device).tril()
            allowed = earlier if allowed is None else allowed & earlier
        return allowed

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`key_mask` (B, T), True where a position is a real token: the others are never attended to."""
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        allowed = self._allowed(key_mask, x.shape[1], x.device)
        if allowed is not None:
            # The dtype's lowest finite value, not -inf: a query with no allowed key (an all-padding
            # row) then averages uniformly instead of producing NaN.
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        mixed = torch.matmul(scores.softmax(dim=-1), v)  # (B, heads, T, d_head)
        out: torch.Tensor = self.out(mixed.transpose(1, 2).flatten(2))
        return out


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, *, causal: bool = False) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = SelfAttention(dim, heads, causal=causal)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), key_mask)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class FirstToken(nn.Module):
    """(B, T, d) -> (B, d): the class token's final representation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


class TextTransformer(nn.Module):
    """Token ids (B, T) -> token embedding + learned positions -> pre-norm blocks -> LayerNorm -> head.

    The padding mask is read off the input (`tokens == pad_id`), so every block is told which
    positions are padding and attention never looks at them. `pooling` says what the head sees:
    "mean" (the mean over the non-padding positions: (B, n_classes)), "first" (the first
    position: (B, n_classes)) or "none" (every position: (B, T, n_outputs), a language model's
    next-token logits). A container: its parameters all belong to its children (an Embedding,
    a PositionalEmbedding, the blocks' Linear and LayerNorm layers, the final LayerNorm and the
    Linear head), which both per-sample engines handle exactly, and it never mixes rows.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        pad_id: int,
        positions: int,
        dim: int,
        heads: int,
        mlp_dim: int,
        layers: int,
        n_outputs: int,
        pooling: str,
        causal: bool,
    ) -> None:
        super().__init__()
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id {pad_id} is not a token id of a vocabulary of {vocab_size}")
        if pooling not in TEXT_POOLINGS:
            raise ValueError(f"pooling must be one of {sorted(TEXT_POOLINGS)}, got {pooling!r}")
        self.pad_id = pad_id
        self.pooling = pooling
        self.embedding = nn.Embedding(vocab_size, dim)
        self.positions = PositionalEmbedding(positions, dim)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, mlp_dim, causal=causal) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_outputs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        real = tokens != self.pad_id  # (B, T)
        x = self.positions(self.embedding(tokens))
        for block in self.blocks:
            x = block(x, real)
        x = self.norm(x)
        out: torch.Tensor
        if self.pooling == "mean":
            weights = real.unsqueeze(-1).to(x.dtype)
            out = self.head((x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0))
        elif self.pooling == "first":
            out = self.head(x[:, 0])
        else:
            out = self.head(x)
        return out


TEXT_POOLINGS: frozenset[str] = frozenset({"mean", "first", "none"})


# Custom module types in the zoo, for the worker's per-sample engines to register: containers
# and parameter-free modules (rows independent) and layers with parameters (each needs a rule).
ZOO_CONTAINERS: tuple[type[nn.Module], ...] = (
    Residual,
    PatchTokens,
    SelfAttention,
    TransformerBlock,
    FirstToken,
    TextTransformer,
)
ZOO_LAYERS: tuple[type[nn.Module], ...] = (WSConv2d, TokenPrepend, PositionalEmbedding)
