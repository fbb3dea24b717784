"""DC-DPSGD's projected traces, exact and QR-free, streaming W in row blocks (docs/algorithms/dc-dpsgd.md#what-it-does).

For a step t, W_t ∈ R^{d_J×k} has i.i.d. entries (−ln U)^θ, U ~ Uniform(0, 1] (Weibull of shape
1/θ: sub-Weibull(θ), non-negative, scale 1 — the scale does not change the span). V_t is an
orthonormal basis of colspan(W_t). For a per-sample gradient g_i restricted to the scope J,

    λ_i = ||V_tᵀ g_i[J]||² / ||g_i[J]||² = p_iᵀ M⁻¹ p_i / ||g_i[J]||²,
    p_i = W_tᵀ g_i[J]   (rows of P = G_J·W_t, B×k),   M = W_tᵀW_t   (k×k, SPD),

because W(WᵀW)⁻¹Wᵀ is the orthogonal projector onto colspan(W) whatever basis spans it. So no QR
and no dense V: W_t is generated block by block of rows from a counter-based stream: the job's
128-bit projection key (``SecureRandom.derive_key``) with (step, block index) in the counter —
NumPy Philox4x64 on the CPU, two keyed CUDA generators on CUDA
(:func:`dp.randomness.secure_random.keyed_uniform`) — used once for P and M and dropped.
λ_i ∈ [0, 1] depends on record i and the data-independent W_t only (per-sample normalisation;
never a batch-level normaliser), which is the precondition of DC-DPSGD's sensitivity bounds
(docs/algorithms/dc-dpsgd.md#privacy-calibration-as-we-charge-it).

Cost per step, for a batch processed in c chunks of per-sample gradients (c = ⌈|S| / max physical
batch size⌉, usually 1): 2·|S|·d_J·k FLOP for P, 2·d_J·k² for M (once per step), c·d_J·k random
variates (W is regenerated for each chunk instead of being stored), k³/3 for the Cholesky factor
of M and |S|·k² for the triangular solve. Extra memory: one W block (block_rows × k), P (|S|×k)
and M (k×k). Each block's products (its part of P, M and the squared norms) are computed in W's
dtype — float32, or float64 for a float64 model — and accumulated across blocks in float64; the
Cholesky factor and the solve are float64. The precision is a matter of utility only: λ_i is a
function of row i and the public W_t however it is rounded, which is all the sensitivity bounds
need. (M's block products in float64 took 40% of a CPU step of a 26k-parameter CNN at k = 200.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from dp.randomness.secure_random import SecureRandom, keyed_uniform

__all__ = [
    "DEFAULT_BLOCK_ELEMENTS",
    "Block",
    "GramAccumulator",
    "Segment",
    "StepProjection",
    "StreamingProjection",
    "gram_traces",
    "weibull_entries",
    "weibull_from_uniform",
]

DEFAULT_BLOCK_ELEMENTS = 1 << 22
"""Entries of W per generated block (16 MiB in float32) unless block_rows is given."""


PROJECTION_KEY_PURPOSE = b"dc-dpsgd-W"
"""The purpose the job's projection key is derived for (``SecureRandom.derive_key``)."""


def weibull_from_uniform(u: torch.Tensor, *, theta: float) -> torch.Tensor:
    """(−ln(1 − u))^θ in place for u ∈ [0, 1): Weibull(shape 1/θ, scale 1), mean Γ(1 + θ).

    P(X > x) = exp(−x^{1/θ}), i.e. sub-Weibull(θ) in the paper's Def. A.1. 1 − u lies in (0, 1],
    so −ln(1 − u) is finite.
    """
    if not (theta > 0 and theta < float("inf")):
        raise ValueError(f"theta must be positive and finite, got {theta}")
    exponential = torch.log1p(u.neg_()).neg_().clamp_min_(0.0)  # −ln(1 − u) ≥ 0
    if theta == 1.0:
        return exponential
    if theta == 2.0:  # the default: a multiply, the value pow gives, at half its cost on a CPU
        return exponential.mul_(exponential)
    return exponential.pow_(theta)


def weibull_entries(
    shape: Sequence[int],
    *,
    theta: float,
    generator: SecureRandom,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """I.i.d. Weibull(shape 1/θ, scale 1) entries from the job's stream (see weibull_from_uniform)."""
    if not (theta > 0 and theta < float("inf")):
        raise ValueError(f"theta must be positive and finite, got {theta}")
    return weibull_from_uniform(generator.uniform(tuple(shape), dtype=dtype, device=device), theta=theta)


@dataclass(frozen=True)
class Segment:
    """Rows [start, stop) of the flattened parameter ``name``."""

    name: str
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Block:
    """Consecutive rows of W over the flattened scope: one or more segments, in scope order (a block
    runs on into the next tensor, so the biases and norm weights of a model share blocks instead of
    costing one generation and three small products each); ``index`` is its counter."""

    index: int
    segments: tuple[Segment, ...]

    @property
    def rows(self) -> int:
        return sum(segment.rows for segment in self.segments)

    def gradient_columns(self, grads: Mapping[str, torch.Tensor], m: int) -> torch.Tensor:
        """The block's columns of a chunk's per-sample gradients, (m, rows): a view for one segment."""
        columns = [grads[seg.name].reshape(m, -1)[:, seg.start : seg.stop] for seg in self.segments]
        return columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)


def gram_traces(P: torch.Tensor, M: torch.Tensor, squared_norms: torch.Tensor) -> torch.Tensor:
    """λ_i = p_iᵀ M⁻¹ p_i / ||g_i[J]||², clamped to [0, 1]; 0 for a zero or non-finite gradient.

    Cholesky M = LLᵀ and one triangular solve Y = L⁻¹Pᵀ, so λ_i = ||Y_{:,i}||². Should M not be
    numerically positive definite (W rank-deficient: probability zero), fall back to the
    pseudo-inverse through an eigendecomposition, which still gives the projector onto span(W).
    Computed in float64.
    """
    P = P.to(torch.float64)
    M = M.to(torch.float64)
    L, info = torch.linalg.cholesky_ex(M)
    if int(info) == 0:
        Y = torch.linalg.solve_triangular(L, P.T, upper=False).T
    else:
        eigenvalues, eigenvectors = torch.linalg.eigh(M)
        cutoff = eigenvalues.max().clamp_min(0.0) * M.shape[0] * torch.finfo(torch.float64).eps
        inv_sqrt = torch.where(
            eigenvalues > cutoff, eigenvalues.clamp_min(torch.finfo(torch.float64).tiny).rsqrt(), 0.0
        )
        Y = (P @ eigenvectors) * inv_sqrt
    squared_norms = squared_norms.to(torch.float64)
    traces = Y.pow(2).sum(dim=1) / squared_norms
    valid = torch.isfinite(traces) & (squared_norms > 0) & torch.isfinite(squared_norms)
    return torch.where(valid, traces, 0.0).clamp_(0.0, 1.0)


@dataclass
class GramAccumulator:
    """P += G_b·W_b, M += W_bᵀW_b over row blocks; ``traces`` gives λ. Blocks may come in any order."""

    k: int
    with_gram: bool = True
    P: torch.Tensor | None = None
    M: torch.Tensor | None = None
    squared_norms: torch.Tensor | None = None

    def add(self, G_block: torch.Tensor, W_block: torch.Tensor) -> None:
        """Add rows of the scope: G_block (m × rows) gradient columns, W_block (rows × k)."""
        if W_block.dim() != 2 or W_block.shape[1] != self.k or G_block.shape[1] != W_block.shape[0]:
            raise ValueError(f"shapes do not match: G block {tuple(G_block.shape)}, W block {tuple(W_block.shape)}")
        G_block = G_block.to(W_block.dtype)
        product = (G_block @ W_block).to(torch.float64)
        squares = torch.linalg.vecdot(G_block, G_block).to(torch.float64)
        if self.P is None:
            self.P, self.squared_norms = product, squares
        else:
            assert self.squared_norms is not None
            self.P.add_(product)
            self.squared_norms.add_(squares)
        if self.with_gram:
            gram = (W_block.T @ W_block).to(torch.float64)
            self.M = gram if self.M is None else self.M.add_(gram)

    def traces(self, M: torch.Tensor | None = None) -> torch.Tensor:
        M = self.M if M is None else M
        if self.P is None or M is None:
            raise ValueError("no block was added")
        assert self.squared_norms is not None
        return gram_traces(self.P, M, self.squared_norms)


@dataclass(frozen=True)
class StreamingProjection:
    """The public description of the projection: k, θ, scope and the W block layout."""

    k: int
    theta: float = 2.0
    scope: tuple[str, ...] | None = None
    """Parameter names to project, or None for every trainable parameter (in model order)."""
    block_rows: int | None = None
    """Rows of W per generated block; default ⌊DEFAULT_BLOCK_ELEMENTS / k⌋. Part of W's key."""

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be an integer >= 1, got {self.k!r}")
        if not (self.theta > 0 and self.theta < float("inf")):
            raise ValueError(f"theta must be positive and finite, got {self.theta!r}")
        if self.scope is not None and (not self.scope or len(set(self.scope)) != len(self.scope)):
            raise ValueError(f"scope must be a non-empty list of distinct names, got {self.scope!r}")
        if self.block_rows is not None and (isinstance(self.block_rows, bool) or self.block_rows < 1):
            raise ValueError(f"block_rows must be >= 1, got {self.block_rows!r}")

    @property
    def rows_per_block(self) -> int:
        return self.block_rows if self.block_rows is not None else max(1, DEFAULT_BLOCK_ELEMENTS // self.k)

    def scope_sizes(self, parameters: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """name → numel of the scope J, in order; raises if a name is unknown or k ≥ d_J."""
        names = list(parameters) if self.scope is None else list(self.scope)
        unknown = [name for name in names if name not in parameters]
        if unknown:
            raise ValueError(
                f"projection scope names unknown trainable parameters {unknown}; known: {list(parameters)}"
            )
        sizes = {name: parameters[name].numel() for name in names}
        d_scope = sum(sizes.values())
        if self.k >= d_scope:
            # span(W) would be all of R^{d_J}: λ ≡ 1 for every sample, the split is meaningless.
            raise ValueError(
                f"the subspace dimension k = {self.k} must be below the projected dimension "
                f"d_J = {d_scope}; lower k or widen the scope"
            )
        return sizes

    def layout(self, parameters: Mapping[str, torch.Tensor]) -> list[Block]:
        """The blocks of W, in order: the scope tensors flattened one after another, cut into
        ⌈d_J / rows_per_block⌉ blocks of rows_per_block rows (the last may be shorter)."""
        rows = self.rows_per_block
        blocks: list[Block] = []
        current: list[Segment] = []
        filled = 0
        for name, numel in self.scope_sizes(parameters).items():
            start = 0
            while start < numel:
                stop = min(numel, start + rows - filled)
                current.append(Segment(name, start, stop))
                filled += stop - start
                start = stop
                if filled == rows:
                    blocks.append(Block(len(blocks), tuple(current)))
                    current, filled = [], 0
        if current:
            blocks.append(Block(len(blocks), tuple(current)))
        return blocks

    def w_block(
        self,
        key: bytes,
        step: int,
        block: Block,
        *,
        device: torch.device | str,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Rows [start, stop) of W_t for this block: deterministic in (key, step, block.index).

        ``key`` is the job's secret 128-bit projection key; (step, block.index) are the counter.
        """
        for name, value in (("step", step), ("block", block.index)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        u = keyed_uniform(key, counter=(step, block.index), shape=(block.rows, self.k), dtype=dtype, device=device)
        return weibull_from_uniform(u, theta=self.theta)

    def dense_w(
        self,
        key: bytes,
        step: int,
        parameters: Mapping[str, torch.Tensor],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """The whole d_J × k matrix W_t (tests and small scopes only: the loop never builds it)."""
        blocks = self.layout(parameters)
        return torch.cat([self.w_block(key, step, b, device=device, dtype=dtype) for b in blocks])


@dataclass
class StepProjection:
    """One step's W_t (key, step): λ for chunks of per-sample gradients; M computed once."""

    projection: StreamingProjection
    blocks: list[Block]
    key: bytes
    step: int
    _M: torch.Tensor | None = field(default=None, repr=False)

    def traces(self, grads: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """λ (float64, shape (m,)) for a chunk of per-sample gradients name → (m, *shape).

        Non-finite gradient rows get λ = 0 (they contribute nothing to the sum either).
        """
        first = next(iter(grads.values()))
        m, device = first.shape[0], first.device
        accumulator = GramAccumulator(self.projection.k, with_gram=self._M is None)
        if m == 0:
            return torch.zeros(0, dtype=torch.float64, device=device)
        dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        for block in self.blocks:
            W = self.projection.w_block(self.key, self.step, block, device=device, dtype=dtype)
            accumulator.add(block.gradient_columns(grads, m), W)
            del W
        if self._M is None:
            self._M = accumulator.M
        return accumulator.traces(self._M)
