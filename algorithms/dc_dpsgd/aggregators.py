"""DC-DPSGD's batch aggregators (RANK and THRESHOLD) for the DP-SGD loop (docs/algorithms/dc-dpsgd.md#what-it-does).

Both implement :class:`dp.per_example.aggregator.BatchAggregator`: ``clipped_sum`` returns the
data part Σ_{i∈S} clip_{c(i)}(g_i) of a step and ``sensitivity`` its add/remove L2 sensitivity
Δ; ``train_dp_sgd`` then adds ONE Gaussian vector N(0, σ²Δ² I), divides by the public expected
batch size and steps. The derivations of Δ (2·c1 − c2 for RANK, c1 for THRESHOLD) and of the
joint accounting of the tracked threshold are in :mod:`algorithms.dc_dpsgd.definition`.

A step, in the order the job's SecureRandom is used (all of it data-independent randomness):

1. W_t is keyed by (job key, step, block): the job's 128-bit projection key comes from
   ``SecureRandom.derive_key`` (no draw; the secret behind it is in the checkpointed state), so
   checkpoint/resume reproduces W_t exactly (see :mod:`algorithms.dc_dpsgd.projection`);
2. the trace noise N(0, σ_tr²) for every row of the batch (drawn even when σ_tr = 0);
3. RANK only: a uniformly random permutation of the batch, the tie-breaking order;
4. per-sample gradients → λ_i (per-sample normalised, so λ_i depends on record i and W_t only),
   λ̃_i = λ_i + noise_i, the split, the clipping with the norm of the FULL per-sample gradient;
5. THRESHOLD with tracking only, after the sum: one N(0, σ_b²) for the released tail count,
   and τ_{t+1} = τ_t·exp(η(b̃_t − p)), b̃_t = (count + noise)/B.

RANK needs every λ̃ of the batch before it can clip, so it iterates the per-sample gradients
twice when the batch spans several chunks (once when it fits in one chunk: the chunk is kept).
THRESHOLD decides per sample and always makes a single pass.

Nothing here is logged or returned except the clipped sum; the tail count is released only
through the charged noisy count. ``tau`` (a function of released values) is the only state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import torch
from torch import nn

from algorithms.dc_dpsgd.projection import PROJECTION_KEY_PURPOSE, StepProjection, StreamingProjection
from dp.per_example.aggregator import BatchAggregator, BatchContext, TensorDict
from dp.per_example.clip_margin import clip_target
from dp.per_example.engines import Engine, check_engine, per_sample_grads_of
from dp.per_example.per_sample import add_weighted_rows, trainable_parameters, zeros_like_trainable
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "TAU_MAX",
    "TAU_MIN",
    "RankAggregator",
    "ThresholdAggregator",
    "ThresholdTracker",
    "add_clipped",
    "clip_scales",
    "rank_tail_mask",
    "tail_count",
    "threshold_tail_mask",
]

TAU_MIN, TAU_MAX = 1e-12, 1e12
"""τ is kept in this range (post-processing of released values; avoids under/overflow)."""


# ----------------------------------------------------------------------------- the split


def tail_count(batch_size: int, p: float) -> int:
    """m = ⌊p·|S|⌋, with p read as the decimal the user wrote (0.3·10 is 3, not 2.999…).

    Non-decreasing in |S| and grows by at most one per added row (p < 1): the rank-coupling
    bound 2·c1 − c2 relies on exactly that.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return math.floor(Fraction(repr(float(p))) * batch_size)


def rank_tail_mask(noisy_traces: torch.Tensor, m: int, order: torch.Tensor) -> torch.Tensor:
    """The m largest noisy traces; ties go to the row that comes first in ``order``.

    ``order`` is a permutation of range(n) — a fresh uniformly random one in training, so ties
    are broken uniformly at random.
    """
    n = noisy_traces.numel()
    mask = torch.zeros(n, dtype=torch.bool, device=noisy_traces.device)
    if m <= 0 or n == 0:
        return mask
    order = order.to(noisy_traces.device)
    ranked = torch.sort(noisy_traces[order], descending=True, stable=True).indices
    mask[order[ranked[:m]]] = True
    return mask


def threshold_tail_mask(noisy_traces: torch.Tensor, tau: float) -> torch.Tensor:
    """Tail iff λ̃_i > τ (a per-sample decision)."""
    return noisy_traces > tau


def clip_scales(norms: torch.Tensor, tail: torch.Tensor, c1: float, c2: float) -> torch.Tensor:
    """min(1, c(i)/||g_i||) with c(i) = c1 for tail, c2 for body; 0 for a non-finite norm.

    ``where`` rather than a clamp: rows already within their clip norm stay bit-identical. Each
    clip norm is the target c·(1 − κ), so that the rounded clipped vector stays within c
    (dp/per_example/clip_margin.py): the sensitivities 2·c1 − c2 and c1 hold as charged.
    """
    low, high = clip_target(c2, norms.dtype), clip_target(c1, norms.dtype)
    clip = torch.full_like(norms, low).masked_fill_(tail.to(norms.device), high)
    scale = torch.where(norms > clip, clip / norms.clamp_min(torch.finfo(norms.dtype).tiny), 1.0)
    return torch.where(torch.isfinite(norms), scale, 0.0)


def add_clipped(
    total: Mapping[str, torch.Tensor],
    grads: Mapping[str, torch.Tensor],
    tail: torch.Tensor,
    *,
    c1: float,
    c2: float,
) -> None:
    """total += Σ_i clip_{c(i)}(g_i) for one chunk; norms over ALL trainable parameters."""
    add_weighted_rows((total,), grads, (lambda norms: clip_scales(norms, tail, c1, c2),))


# ----------------------------------------------------------------------------- shared step setup


@dataclass
class _DCAggregator(BatchAggregator):
    c1: float
    c2: float
    projection: StreamingProjection
    sigma_tr: float = 0.0
    engine: Engine = "auto"
    """Where the per-sample gradients come from (dp.per_example.engines): "auto" builds them
    from ghost clipping's records wherever that is exact, else vmaps autograd; same gradients."""

    def __post_init__(self) -> None:
        check_engine(self.engine)
        for name in ("c1", "c2"):
            value = getattr(self, name)
            if not (value > 0 and value < float("inf")):
                raise ValueError(f"{name} must be positive and finite, got {value}")
        if self.c1 < self.c2:
            raise ValueError(f"c1 ({self.c1}) must be >= c2 ({self.c2})")
        if not (self.sigma_tr >= 0 and self.sigma_tr < float("inf")):
            raise ValueError(f"sigma_tr must be finite and >= 0, got {self.sigma_tr}")

    def check(self, model: nn.Module) -> int:
        """Validate the scope against the model (names known, k < d_J); returns d_J."""
        return sum(self.projection.scope_sizes(trainable_parameters(model)).values())

    def _begin(self, model: nn.Module, n: int, context: BatchContext) -> tuple[StepProjection, torch.Tensor]:
        blocks = self.projection.layout(trainable_parameters(model))
        key = context.generator.derive_key(PROJECTION_KEY_PURPOSE)
        trace_noise = context.generator.normal(n, std=self.sigma_tr, dtype=torch.float64)
        return StepProjection(self.projection, blocks, key, context.step), trace_noise


@dataclass
class RankAggregator(_DCAggregator):
    """The paper's rule: the ⌊p·|S|⌋ largest λ̃ are tail (clip c1), the rest body (clip c2).

    Add/remove sensitivity 2·c1 − c2 (rank coupling: a new row entering the top set also pushes
    the previous m-th row from c1 to c2).
    """

    p: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        tail_count(1, self.p)  # validates p

    @property
    def sensitivity(self) -> float:
        return 2.0 * self.c1 - self.c2

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        n, mpbs = X.shape[0], context.max_physical_batch_size
        projection, trace_noise = self._begin(model, n, context)
        order = context.generator.permutation(n)
        total = zeros_like_trainable(model)
        per_sample_grads = per_sample_grads_of(model, self.engine)
        with torch.no_grad():
            kept: dict[str, torch.Tensor] | None = None
            single_chunk = n <= mpbs
            traces = []
            for grads in per_sample_grads(model, X, y, loss=context.loss, max_physical_batch_size=mpbs):
                traces.append(projection.traces(grads).to(trace_noise.device))
                kept = grads if single_chunk else None
                del grads
            if n == 0:
                return total
            noisy = torch.cat(traces) + trace_noise
            tail = rank_tail_mask(noisy, tail_count(n, self.p), order)
            if kept is not None:
                add_clipped(total, kept, tail, c1=self.c1, c2=self.c2)
                return total
            start = 0  # second pass: the same rows in the same order, now clipped
            for grads in per_sample_grads(model, X, y, loss=context.loss, max_physical_batch_size=mpbs):
                m = next(iter(grads.values())).shape[0]
                add_clipped(total, grads, tail[start : start + m], c1=self.c1, c2=self.c2)
                start += m
        return total


@dataclass
class ThresholdTracker:
    """Private geometric tracking of τ toward a tail fraction p (Andrew et al. 2021 style).

    Per step it releases b̃ = (count + N(0, σ_b²)) / B with B the PUBLIC expected batch size and
    sets τ ← τ·exp(η·(b̃ − p)). σ_b must be the r·σ the job was charged for (σ_eff).
    """

    target_fraction: float
    eta: float
    count_noise_std: float
    expected_batch_size: float

    def __post_init__(self) -> None:
        if not 0.0 < self.target_fraction < 1.0:
            raise ValueError(f"target_fraction must be in (0, 1), got {self.target_fraction}")
        if not (self.eta > 0 and self.eta < float("inf")):
            raise ValueError(f"eta must be positive and finite, got {self.eta}")
        if not (self.count_noise_std >= 0 and self.count_noise_std < float("inf")):
            raise ValueError(f"count_noise_std must be finite and >= 0, got {self.count_noise_std}")
        if not (self.expected_batch_size > 0 and self.expected_batch_size < float("inf")):
            raise ValueError(f"expected_batch_size must be positive, got {self.expected_batch_size}")

    def next_tau(self, tau: float, count: int, generator: SecureRandom) -> float:
        """τ_{t+1} from τ_t and the (private) tail count; draws the count's noise."""
        noise = float(generator.normal((), std=1.0, dtype=torch.float64))
        released_fraction = (count + self.count_noise_std * noise) / self.expected_batch_size
        exponent = self.eta * (released_fraction - self.target_fraction)
        exponent = min(max(exponent, -700.0), 700.0)
        return min(max(tau * math.exp(exponent), TAU_MIN), TAU_MAX)


@dataclass
class ThresholdAggregator(_DCAggregator):
    """Per-sample rule: tail iff λ̃_i > τ_t (clip c1), else body (clip c2). Sensitivity c1.

    ``tau`` None: τ_0 = k/d_J, the mean trace of a random k-dimensional subspace (public: it
    depends on the architecture and k only). With a ``tracker``, τ_t moves after every step;
    ``state_dict``/``load_state_dict`` carry τ_t across checkpoints (the DP-SGD loop's own
    checkpoint holds model, optimizer and generator only; see algorithms.dc_dpsgd.trainer).
    """

    tau: float | None = None
    tracker: ThresholdTracker | None = None
    _initial_tau: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tau is not None and not (self.tau > 0 and self.tau < float("inf")):
            raise ValueError(f"tau must be positive and finite, got {self.tau}")
        self._initial_tau = self.tau

    @property
    def sensitivity(self) -> float:
        return self.c1

    def current_tau(self, model: nn.Module) -> float:
        if self.tau is None:
            self.tau = self.projection.k / self.check(model)
            self._initial_tau = self.tau
        return self.tau

    def state_dict(self) -> dict[str, Any]:
        return {"tau": self.tau}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        tau = state.get("tau")
        if tau is not None:
            tau = float(tau)
            if not (tau > 0 and math.isfinite(tau)):
                raise ValueError(f"checkpointed tau must be positive and finite, got {tau}")
        self.tau = tau if tau is not None else self._initial_tau

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        n, mpbs = X.shape[0], context.max_physical_batch_size
        tau = self.current_tau(model)
        projection, trace_noise = self._begin(model, n, context)
        total = zeros_like_trainable(model)
        per_sample_grads = per_sample_grads_of(model, self.engine)
        count = 0
        start = 0
        with torch.no_grad():
            for grads in per_sample_grads(model, X, y, loss=context.loss, max_physical_batch_size=mpbs):
                traces = projection.traces(grads).to(trace_noise.device)
                m = traces.shape[0]
                tail = threshold_tail_mask(traces + trace_noise[start : start + m], tau)
                add_clipped(total, grads, tail, c1=self.c1, c2=self.c2)
                count += int(tail.sum())
                start += m
                del grads
        if self.tracker is not None:
            self.tau = self.tracker.next_tau(tau, count, context.generator)
        return total
