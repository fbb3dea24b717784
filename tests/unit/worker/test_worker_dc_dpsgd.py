"""DC-DPSGD worker: projection (T1-T4), split and clipping (T5-T7), noise (T8-T9), tracking (T10),
resume, and a small learning check (docs/algorithms/dc-dpsgd.md)."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

import algorithms.dc_dpsgd.aggregators as dc_module
from algorithms import get_algorithm
from algorithms.dc_dpsgd.aggregators import (
    RankAggregator,
    ThresholdAggregator,
    ThresholdTracker,
    clip_scales,
    rank_tail_mask,
    tail_count,
    threshold_tail_mask,
)
from algorithms.dc_dpsgd.projection import (
    PROJECTION_KEY_PURPOSE,
    GramAccumulator,
    StepProjection,
    StreamingProjection,
    weibull_entries,
)
from algorithms.dc_dpsgd.trainer import TAU_CHECKPOINT_KEY
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.loop.state import TrainingHooks, TrainingState
from dp.per_example.clip_margin import clip_target
from dp.per_example.per_sample import iter_per_sample_grads, trainable_parameters
from dp.randomness.secure_random import SecureRandom, keyed_uniform
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate, TrainingSpec
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_training_state, save_training_state


def _seeded(seed: int, device: str = "cpu") -> torch.Generator:
    """Test data and model init only (non-private)."""
    return torch.Generator(device=device).manual_seed(seed)


def _rng(seed: int) -> SecureRandom:
    """A fixed-seed noise stream: tests only."""
    return SecureRandom.from_seed(seed)


def _key(seed: int) -> bytes:
    """The 128-bit projection key of the job whose stream is _rng(seed)."""
    return _rng(seed).derive_key(PROJECTION_KEY_PURPOSE)


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors.values()])


def _qr_traces(G: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The textbook route: V = thin-QR(W), λ_i = ||Vᵀ g_i||² / ||g_i||² (float64)."""
    Q, _ = torch.linalg.qr(W.double())
    G = G.double()
    return (G @ Q).pow(2).sum(dim=1) / G.pow(2).sum(dim=1)


# ----------------------------------------------------------------------------- T1 sampler


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("theta", [0.5, 1.0, 2.0])
def test_weibull_sampler_has_the_sub_weibull_law(theta: float, dtype: torch.dtype) -> None:
    n = 200_000
    x = weibull_entries((n,), theta=theta, generator=_rng(int(10 * theta)), dtype=dtype)
    x = x.double().numpy()
    assert x.min() >= 0.0 and np.isfinite(x).all()
    ks = stats.kstest(x, lambda v: 1.0 - np.exp(-np.power(v, 1.0 / theta)))
    assert ks.pvalue > 0.01, ks
    mean, second = math.gamma(1 + theta), math.gamma(1 + 2 * theta)
    assert abs(x.mean() - mean) < 5 * math.sqrt((second - mean**2) / n)
    assert {0.5: 0.886, 1.0: 1.0, 2.0: 2.0}[theta] == pytest.approx(mean, abs=1e-3)


# ----------------------------------------------------------------------------- T2 Gram = QR


def test_gram_route_equals_qr_route() -> None:
    d, k, B = 2000, 50, 16
    gen = _seeded(0)
    W = weibull_entries((d, k), theta=2.0, generator=_rng(0), dtype=torch.float64)
    # Heavy-tailed, sparse-ish and dense gradients, various scales (λ must be scale-free).
    G = torch.from_numpy(np.random.default_rng(0).standard_t(1.5, size=(B, d)))
    G[:4] *= torch.rand(4, d, generator=gen, dtype=torch.float64) < 0.01
    G *= torch.logspace(-3, 3, B, dtype=torch.float64)[:, None]

    one_shot = GramAccumulator(k)
    one_shot.add(G, W)
    traces = one_shot.traces()
    torch.testing.assert_close(traces, _qr_traces(G, W), rtol=1e-6, atol=0)
    assert bool(((traces >= 0) & (traces <= 1)).all())

    # Streaming in blocks of 7 rows (in a shuffled order) equals the one-shot accumulation.
    streamed = GramAccumulator(k)
    starts = list(range(0, d, 7))
    random.Random(1).shuffle(starts)
    for start in starts:
        streamed.add(G[:, start : start + 7], W[start : start + 7])
    torch.testing.assert_close(streamed.traces(), traces, rtol=1e-10, atol=1e-14)

    # λ = 1 inside colspan(W), 0 on its orthogonal complement, for any scale.
    Q, _ = torch.linalg.qr(W)
    inside = (W @ torch.randn(k, 3, generator=gen, dtype=torch.float64)).T * 1e4
    raw = torch.randn(3, d, generator=gen, dtype=torch.float64)
    orthogonal = raw - (raw @ Q) @ Q.T
    special = GramAccumulator(k)
    special.add(torch.cat([inside, orthogonal]), W)
    torch.testing.assert_close(
        special.traces(), torch.tensor([1.0, 1, 1, 0, 0, 0], dtype=torch.float64), rtol=0, atol=1e-9
    )

    # A rank-deficient W (a repeated column: Cholesky fails) still projects onto its span.
    repeated = torch.cat([W[:, : k - 1], W[:, :1]], dim=1)
    deficient = GramAccumulator(k)
    deficient.add(G, repeated)
    torch.testing.assert_close(deficient.traces(), _qr_traces(G, W[:, : k - 1]), rtol=1e-6, atol=0)

    # A zero gradient has λ = 0 (u := 0), a non-finite one too; its neighbours are untouched.
    bad = G[:3].clone()
    bad[0] = 0.0
    bad[1, 5] = float("nan")
    odd = GramAccumulator(k)
    odd.add(bad, W)
    out = odd.traces()
    assert out[0] == 0.0 and out[1] == 0.0
    torch.testing.assert_close(out[2], traces[2], rtol=1e-10, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_streamed_projection_of_parameter_chunks_equals_qr(dtype: torch.dtype) -> None:
    """The training path: W generated block by block across two tensors, vs QR of the whole W."""
    params = {"w": torch.zeros(40, 30), "b": torch.zeros(800)}  # d_J = 2000
    projection = StreamingProjection(k=50, theta=2.0, block_rows=97)
    blocks = projection.layout(params)
    assert len(blocks) == math.ceil(2000 / 97)  # one block runs on from "w" into "b"
    assert [seg.name for seg in blocks[12].segments] == ["w", "b"]
    gen = _seeded(3)
    grads = {
        "w": torch.randn(16, 40, 30, generator=gen, dtype=dtype),
        "b": torch.randn(16, 800, generator=gen, dtype=dtype),
    }
    step = StepProjection(projection, blocks, key=_key(11), step=5)
    traces = step.traces(grads)
    W = projection.dense_w(_key(11), 5, params, dtype=dtype)
    G = torch.cat([grads["w"].reshape(16, -1), grads["b"]], dim=1)
    torch.testing.assert_close(traces, _qr_traces(G, W), rtol=1e-9 if dtype == torch.float64 else 1e-4, atol=0)
    # A second chunk of the same step reuses M and gives the same λ for the same rows.
    torch.testing.assert_close(
        step.traces({n: g[:5] for n, g in grads.items()}),
        traces[:5],
        rtol=1e-12 if dtype == torch.float64 else 1e-6,
        atol=0,
    )


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    block_rows=st.integers(1, 50),
)
def test_blocks_cover_the_scope_once_in_order(sizes: list[int], block_rows: int) -> None:
    """Every row of the flattened scope is in exactly one block, in scope order; every block but
    the last is full; the number of blocks is ⌈d_J / block_rows⌉ however the tensors are cut."""
    params = {f"p{i}": torch.zeros(size) for i, size in enumerate(sizes)}
    d = sum(sizes)
    assume(d > 1)
    projection = StreamingProjection(k=1, block_rows=block_rows)
    blocks = projection.layout(params)
    assert [b.index for b in blocks] == list(range(math.ceil(d / block_rows)))
    assert all(b.rows == block_rows for b in blocks[:-1]) and 0 < blocks[-1].rows <= block_rows
    covered = [(seg.name, row) for b in blocks for seg in b.segments for row in range(seg.start, seg.stop)]
    assert covered == [(name, row) for name, size in zip(params, sizes, strict=True) for row in range(size)]
    grads = {name: torch.arange(size, dtype=torch.float64).expand(2, size) + 100 * i for i, (name, size) in
             enumerate(zip(params, sizes, strict=True))}  # fmt: skip
    columns = torch.cat([b.gradient_columns(grads, 2) for b in blocks], dim=1)
    assert torch.equal(columns, torch.cat(list(grads.values()), dim=1))


def test_mean_trace_is_about_k_over_d() -> None:
    """T11 (first part): E[λ] ≈ k/d for dense gradients (d = 5000, k = 200 → 0.04)."""
    params = {"w": torch.zeros(5000)}
    projection = StreamingProjection(k=200, theta=2.0)
    traces = StepProjection(projection, projection.layout(params), key=_key(1), step=0).traces(
        {"w": torch.randn(64, 5000, generator=_seeded(2))}
    )
    assert float(traces.mean()) == pytest.approx(0.04, rel=0.05)


def _sparse_and_dense_rows(n_each: int, d: int, nonzeros: int, generator: torch.Generator) -> torch.Tensor:
    """n_each rows with `nonzeros` Gaussian coordinates at random places, then n_each dense rows."""
    sparse = torch.zeros(n_each, d)
    for row in sparse:
        row[torch.randperm(d, generator=generator)[:nonzeros]] = torch.randn(nonzeros, generator=generator)
    return torch.cat([sparse, torch.randn(n_each, d, generator=generator)])


def test_non_negative_heavy_tailed_v_selects_sparse_gradients_more_often() -> None:
    """T11 (third part): with θ = 2 and W ≥ 0, λ has the same mean (k/d) for 20-sparse
    and dense gradients but a spread about 2.5× larger for the sparse ones, so the RANK tail
    (top 10% of the batch, σ_tr = 0) is mostly sparse rows, far from the 50% a trace-blind
    selection would give."""
    gen = _seeded(12)
    d, half, steps = 5000, 32, 12
    projection = StreamingProjection(k=200, theta=2.0)
    blocks = projection.layout({"w": torch.zeros(d)})
    sparse_traces, dense_traces, sparse_in_tail, tail_total = [], [], 0, 0
    for step in range(steps):
        traces = StepProjection(projection, blocks, key=_key(4), step=step).traces(
            {"w": _sparse_and_dense_rows(half, d, 20, gen)}
        )
        sparse_traces.append(traces[:half])
        dense_traces.append(traces[half:])
        m = tail_count(2 * half, 0.1)
        tail = rank_tail_mask(traces, m, torch.randperm(2 * half, generator=gen))
        sparse_in_tail += int(tail[:half].sum())
        tail_total += m
    sparse, dense = torch.cat(sparse_traces), torch.cat(dense_traces)
    assert float(sparse.mean()) == pytest.approx(0.04, rel=0.08)
    assert float(dense.mean()) == pytest.approx(0.04, rel=0.05)
    assert float(sparse.std()) > 1.8 * float(dense.std())
    assert stats.binomtest(sparse_in_tail, tail_total, 0.5, alternative="greater").pvalue < 1e-6


def _rank_inclusion_counts(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    sigma_tr: float,
    steps: int,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-row tail counts over `steps` calls of the real RANK aggregator on the same batch, and
    the noisy traces it ranked (spied on the split, which is what the aggregator clips by)."""
    counts = torch.zeros(X.shape[0])
    ranked: list[torch.Tensor] = []
    original = dc_module.rank_tail_mask

    def spy(noisy: torch.Tensor, m: int, order: torch.Tensor) -> torch.Tensor:
        mask = original(noisy, m, order)
        counts.add_(mask.double())
        ranked.append(noisy.clone())
        return mask

    monkeypatch.setattr(dc_module, "rank_tail_mask", spy)
    aggregator = RankAggregator(
        c1=1.0, c2=0.1, projection=StreamingProjection(k=4, theta=2.0), sigma_tr=sigma_tr, p=0.1
    )
    gen = _rng(21)
    for step in range(steps):  # W_t is keyed by the step: a fresh one every call
        aggregator.clipped_sum(model, X, y, step=step, loss="cross_entropy", max_physical_batch_size=64, generator=gen)
    return counts, ranked


def test_large_trace_noise_makes_the_rank_selection_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    """T11 (second part): with σ_tr ≥ 10·sd(λ) every row of a fixed batch lands in the tail about
    equally often (χ² on per-row inclusion counts); with σ_tr = 0 (W_t still fresh every step) the
    selection favours the sparse rows and the same χ² rejects uniformity, so it can tell them apart."""
    model = build_model("logistic-regression", {}, input_shape=(12,), n_outputs=3, generator=_seeded(0))
    X = _sparse_and_dense_rows(20, 12, 2, _seeded(1)) * 3.0
    y = torch.randint(0, 3, (40,), generator=_seeded(2))
    steps, p = 400, tail_count(40, 0.1) / 40

    def chi2_pvalue(counts: torch.Tensor) -> float:
        expected = steps * p
        statistic = float(((counts - expected) ** 2).sum()) / (expected * (1 - p))
        return float(stats.chi2.sf(statistic, df=counts.numel() - 1))

    quiet, ranked = _rank_inclusion_counts(model, X, y, sigma_tr=0.0, steps=steps, monkeypatch=monkeypatch)
    sd_lambda = float(ranked[0].std())
    assert sd_lambda > 0
    assert chi2_pvalue(quiet) < 1e-6
    noisy, _ = _rank_inclusion_counts(model, X, y, sigma_tr=10 * sd_lambda, steps=steps, monkeypatch=monkeypatch)
    assert float(noisy.sum()) == steps * tail_count(40, 0.1)
    assert chi2_pvalue(noisy) > 1e-3


# ----------------------------------------------------------------------------- T3 determinism


def test_same_seed_and_step_reproduce_w_and_traces() -> None:
    params = {"a": torch.zeros(3, 4), "b": torch.zeros(7)}
    projection = StreamingProjection(k=8, theta=2.0, block_rows=5)
    key = _key(123)
    W = projection.dense_w(key, 4, params)
    assert W.shape == (19, 8)
    assert torch.equal(W, projection.dense_w(key, 4, params))
    assert not torch.equal(W, projection.dense_w(key, 5, params))  # another step
    assert not torch.equal(W, projection.dense_w(_key(124), 4, params))  # another job key
    blocks = projection.layout(params)
    first, second = (projection.w_block(key, 4, b, device="cpu") for b in blocks[:2])
    assert not torch.equal(first, second)  # blocks are not copies of one another
    streams = {tuple(keyed_uniform(key, counter=c, shape=4).tolist()) for c in ((2, 3), (3, 2), (2, 4), (0, 0))}
    assert len(streams) == 4  # (step, block) counters never share a stream
    flipped = bytes([key[0] ^ 0x80]) + key[1:]  # one bit of the 128-bit key
    assert not torch.equal(keyed_uniform(key, counter=(2, 3), shape=4), keyed_uniform(flipped, counter=(2, 3), shape=4))

    grads = {"a": torch.randn(6, 3, 4, generator=_seeded(0)), "b": torch.randn(6, 7, generator=_seeded(1))}
    lam = StepProjection(projection, blocks, key, 4).traces(grads)
    assert torch.equal(lam, StepProjection(projection, blocks, key, 4).traces(grads))
    assert not torch.equal(lam, StepProjection(projection, blocks, key, 5).traces(grads))


# ----------------------------------------------------------------------------- T4 k ≥ d_J


def test_k_at_least_the_projected_dimension_is_refused() -> None:
    model = build_model("logistic-regression", {}, input_shape=(20,), n_outputs=10, generator=_seeded(0))
    params = trainable_parameters(model)
    assert sum(StreamingProjection(k=200).scope_sizes(params).values()) == 210
    for k, scope in ((210, None), (211, None), (10, ("1.bias",)), (200, ("1.bias",))):
        with pytest.raises(ValueError, match="must be below the projected dimension"):
            StreamingProjection(k=k, scope=scope).layout(params)
    with pytest.raises(ValueError, match="unknown trainable parameters"):
        StreamingProjection(k=3, scope=("2.weight",)).layout(params)
    # The code's CIFAR linear probe (bias of 10 entries, k = 200) fails before any step.
    aggregator = RankAggregator(c1=1.0, c2=0.1, projection=StreamingProjection(k=200, scope=("1.bias",)))
    with pytest.raises(ValueError, match="k = 200"):
        aggregator.check(model)


# ----------------------------------------------------------------------------- T5 split


def test_tail_count_is_floor_p_times_batch_and_grows_by_at_most_one() -> None:
    assert tail_count(10, 0.3) == 3 and tail_count(30, 0.1) == 3 and tail_count(9, 0.1) == 0
    assert tail_count(256, 0.1) == 25 and tail_count(3, 0.5) == 1 and tail_count(2, 0.5) == 1
    for p in (0.01, 0.05, 0.1, 0.3, 0.5, 0.77, 0.99):
        counts = [tail_count(n, p) for n in range(0, 1001)]
        assert all(0 <= b - a <= 1 for a, b in itertools.pairwise(counts))
        assert all(c == math.floor(p * n + 1e-9) for n, c in enumerate(counts))


def test_rank_split_takes_exactly_the_top_of_the_noisy_traces() -> None:
    gen = _seeded(4)
    for n in (1, 2, 7, 64, 255):
        noisy = torch.rand(n, generator=gen, dtype=torch.float64)
        for p in (0.05, 0.1, 0.5, 0.9):
            m = tail_count(n, p)
            mask = rank_tail_mask(noisy, m, torch.randperm(n, generator=gen))
            assert int(mask.sum()) == m
            if 0 < m < n:
                assert float(noisy[mask].min()) > float(noisy[~mask].max())


def test_rank_ties_are_broken_uniformly_at_random() -> None:
    gen = _seeded(5)
    noisy = torch.tensor([0.9, 0.5, 0.5, 0.5, 0.1, 0.5], dtype=torch.float64)
    trials = 3000
    counts = torch.zeros(6)
    for _ in range(trials):
        counts += rank_tail_mask(noisy, 3, torch.randperm(6, generator=gen)).double()
    assert counts[0] == trials and counts[4] == 0  # strictly larger always in, smaller never
    tied = counts[[1, 2, 3, 5]]
    assert float(tied.sum()) == 2 * trials
    chi2 = float(((tied - trials / 2) ** 2 / (trials / 2)).sum())
    assert stats.chi2.sf(chi2, df=3) > 1e-3


def test_threshold_split_is_per_sample() -> None:
    noisy = torch.tensor([0.1, 0.2, 0.2000001, 0.5, -1.0], dtype=torch.float64)
    assert threshold_tail_mask(noisy, 0.2).tolist() == [False, False, True, True, False]


# ----------------------------------------------------------------------------- T6 clipping


def test_clip_scales_bound_each_sample_by_its_clip_and_leave_small_ones_alone() -> None:
    gen = _seeded(6)
    norms = torch.logspace(-3, 3, 500, dtype=torch.float64)[torch.randperm(500, generator=gen)]
    tail = torch.rand(500, generator=gen) < 0.3
    c1, c2 = 1.0, 0.1
    scale = clip_scales(norms, tail, c1, c2)
    clipped = scale * norms
    assert bool((clipped[tail] <= c1 * (1 + 1e-12)).all())
    assert bool((clipped[~tail] <= c2 * (1 + 1e-12)).all())
    # Each clip norm is the target c·(1 − κ) (dp/per_example/clip_margin.py): the rounded result stays within c.
    limit = torch.full_like(norms, clip_target(c2, norms.dtype)).masked_fill_(tail, clip_target(c1, norms.dtype))
    assert bool((scale[norms <= limit] == 1.0).all())
    torch.testing.assert_close(clipped[norms > limit], limit[norms > limit], rtol=1e-12, atol=0)
    bad = clip_scales(torch.tensor([float("nan"), float("inf"), 2.0]), torch.tensor([True, False, True]), c1, c2)
    assert bad.tolist() == [0.0, 0.0, pytest.approx(0.5 * (1 - 2.0**-21), rel=1e-7)]


def test_clipping_uses_the_norm_of_the_full_gradient_not_the_scope() -> None:
    """One row (m = ⌊0.1⌋ = 0: body): the sum is g·c2/||g|| with ||g|| over ALL parameters."""
    model = build_model("logistic-regression", {}, input_shape=(30,), n_outputs=4, generator=_seeded(0))
    X = 10 * torch.randn(1, 30, generator=_seeded(1))
    y = torch.tensor([2])
    grads = next(iter_per_sample_grads(model, X, y, loss="cross_entropy", max_physical_batch_size=8))
    full = _flat({n: g[0] for n, g in grads.items()})
    assert float(grads["1.bias"][0].norm()) < float(full.norm())
    c2 = 0.01
    aggregator = RankAggregator(c1=1.0, c2=c2, projection=StreamingProjection(k=2, scope=("1.bias",)), p=0.1)
    total = aggregator.clipped_sum(
        model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=8, generator=_rng(2)
    )
    torch.testing.assert_close(_flat(total), full * (c2 / full.norm()), rtol=1e-5, atol=1e-9)


def _manual_step(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    mode: str,
    c1: float,
    c2: float,
    p: float,
    tau: float,
    sigma_tr: float,
    projection: StreamingProjection,
    seed: int,
    step: int,
) -> tuple[torch.Tensor, int]:
    """An independent re-implementation of one aggregator step: dense W, QR, explicit sort."""
    replay = _rng(seed)
    key = replay.derive_key(PROJECTION_KEY_PURPOSE)
    n = X.shape[0]
    noise = replay.normal(n, std=1.0, dtype=torch.float64) * sigma_tr
    W = projection.dense_w(key, step, trainable_parameters(model))  # the same public W_t
    grads = next(iter_per_sample_grads(model, X, y, loss="cross_entropy", max_physical_batch_size=n))
    G = torch.cat([g.reshape(n, -1) for g in grads.values()], dim=1).double()
    noisy = _qr_traces(G, W) + noise
    if mode == "rank":
        order = replay.permutation(n).tolist()
        m = math.floor(round(p * n, 9))
        ranked = sorted(order, key=lambda i: -float(noisy[i]))  # stable: ties keep `order`
        tail = set(ranked[:m])
    else:
        tail = {i for i in range(n) if float(noisy[i]) > tau}
    total = torch.zeros(G.shape[1], dtype=torch.float64)
    for i in range(n):
        c = c1 if i in tail else c2
        total += G[i] * min(1.0, c / float(G[i].norm()))
    return total, len(tail)


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
@pytest.mark.parametrize("mode", ["rank", "threshold"])
@pytest.mark.parametrize("chunk", [64, 7])
def test_aggregator_equals_an_independent_implementation(mode: str, chunk: int, engine: str) -> None:
    """T5/T6 end to end: traces, split (incl. noisy traces) and clipping of a real model, with the
    per-sample gradients from either engine (the reference uses the vmap engine's)."""
    model = build_model("mlp", {"hidden_sizes": [6]}, input_shape=(5,), n_outputs=3, generator=_seeded(0))
    X = torch.randn(40, 5, generator=_seeded(1)) * torch.logspace(-1, 1, 40)[:, None]
    y = torch.randint(0, 3, (40,), generator=_seeded(2))
    c1, c2, p, k, sigma_tr = 1.0, 0.05, 0.25, 10, 0.01
    d = sum(q.numel() for q in model.parameters())
    tau = k / d
    projection = StreamingProjection(k=k, theta=2.0, block_rows=13)
    if mode == "rank":
        aggregator = RankAggregator(c1=c1, c2=c2, projection=projection, sigma_tr=sigma_tr, p=p, engine=engine)
    else:
        aggregator = ThresholdAggregator(c1=c1, c2=c2, projection=projection, sigma_tr=sigma_tr, engine=engine)
    total = aggregator.clipped_sum(
        model, X, y, step=3, loss="cross_entropy", max_physical_batch_size=chunk, generator=_rng(77)
    )
    expected, n_tail = _manual_step(
        model, X, y, mode=mode, c1=c1, c2=c2, p=p, tau=tau, sigma_tr=sigma_tr, projection=projection, seed=77, step=3
    )
    assert 0 < n_tail < 40
    torch.testing.assert_close(_flat(total).double(), expected, rtol=1e-4, atol=1e-6)
    if mode == "threshold":
        assert aggregator.tau == tau  # default τ_0 = k/d_J; no tracking, so unchanged


# ----------------------------------------------------------------------------- T7 sensitivity


def _sum_given_traces(
    grads: torch.Tensor,
    noisy: torch.Tensor,
    keys: torch.Tensor,
    *,
    mode: str,
    c1: float,
    c2: float,
    p: float = 0.5,
    tau: float = 0.5,
) -> torch.Tensor:
    """Σ clip_{c(i)}(g_i) for given per-record traces and tie-breaking priorities."""
    if mode == "rank":
        tail = rank_tail_mask(noisy, tail_count(noisy.numel(), p), torch.argsort(keys))
    else:
        tail = threshold_tail_mask(noisy, tau)
    return clip_scales(grads.norm(dim=1), tail, c1, c2) @ grads


def test_rank_coupling_example_shifts_the_sum_by_2c1_minus_c2() -> None:
    """The example of docs/algorithms/dc-dpsgd.md#rank-rule-sensitivity: D = {a, b},
    D' = D ∪ {z}, p = 1/2 → ||Σ(D') − Σ(D)|| = 1.9 = 2·c1 − c2."""
    e1, e2 = torch.eye(2, dtype=torch.float64)
    g_a, g_b, g_z = 5 * e1, 0.01 * e2, -5 * e1
    D = torch.stack([g_a, g_b])
    D_plus = torch.stack([g_a, g_b, g_z])
    lam, lam_plus = torch.tensor([0.5, 0.2], dtype=torch.float64), torch.tensor([0.5, 0.2, 0.9], dtype=torch.float64)
    keys, keys_plus = torch.arange(2.0), torch.arange(3.0)
    sum_D = _sum_given_traces(D, lam, keys, mode="rank", c1=1.0, c2=0.1)
    sum_D_plus = _sum_given_traces(D_plus, lam_plus, keys_plus, mode="rank", c1=1.0, c2=0.1)
    torch.testing.assert_close(sum_D, e1 + g_b)
    torch.testing.assert_close(sum_D_plus, -e1 + 0.1 * e1 + g_b)
    assert float((sum_D_plus - sum_D).norm()) == pytest.approx(1.9, abs=1e-12)
    # The same pair under the threshold rule (τ = 0.4: a and z tail) moves by c1 only.
    shift = _sum_given_traces(
        D_plus, lam_plus, keys_plus, mode="threshold", c1=1.0, c2=0.1, tau=0.4
    ) - _sum_given_traces(D, lam, keys, mode="threshold", c1=1.0, c2=0.1, tau=0.4)
    assert float(shift.norm()) == pytest.approx(1.0, abs=1e-12)


def test_fuzzed_neighbours_never_move_the_sum_by_more_than_the_sensitivity() -> None:
    rng = np.random.default_rng(0)
    worst = {"rank": 0.0, "threshold": 0.0}
    for _ in range(1500):
        n, dim = int(rng.integers(1, 10)), int(rng.integers(1, 4))
        c2 = float(rng.uniform(0.05, 1.0))
        c1 = c2 * float(rng.uniform(1.0, 20.0))
        p, tau = float(rng.uniform(0.05, 0.95)), float(rng.uniform(0, 1))
        grads = torch.from_numpy(rng.standard_normal((n + 1, dim)) * 10 ** rng.uniform(-2, 2, (n + 1, 1)))
        if rng.random() < 0.5:  # many ties
            noisy = torch.from_numpy(rng.integers(0, 3, n + 1) / 2.0)
        else:
            noisy = torch.from_numpy(rng.uniform(0, 1, n + 1))
        keys = torch.from_numpy(rng.permutation(n + 1)).double()  # per-record tie-break priority
        z = int(rng.integers(0, n + 1))  # where the added record sits in D'
        keep = [i for i in range(n + 1) if i != z]
        for mode, bound in (("rank", 2 * c1 - c2), ("threshold", c1)):
            with_z = _sum_given_traces(grads, noisy, keys, mode=mode, c1=c1, c2=c2, p=p, tau=tau)
            without = _sum_given_traces(grads[keep], noisy[keep], keys[keep], mode=mode, c1=c1, c2=c2, p=p, tau=tau)
            shift = float((with_z - without).norm())
            assert shift <= bound * (1 + 1e-9), (mode, shift, bound)
            worst[mode] = max(worst[mode], shift / c1)
    assert worst["rank"] > 1.5  # the coupling term is real: c1 alone would be violated
    assert worst["threshold"] <= 1.0 + 1e-9


def test_fuzzed_neighbours_through_the_real_aggregators() -> None:
    """Same W (same generator), σ_tr = 0: adding one row moves the released sum by ≤ Δ."""
    rng = np.random.default_rng(1)
    model = build_model("mlp", {"hidden_sizes": [4]}, input_shape=(3,), n_outputs=3, generator=_seeded(0))
    projection = StreamingProjection(k=5, theta=2.0)
    c1, c2 = 0.5, 0.05
    for trial in range(25):
        n = int(rng.integers(2, 12))
        X = torch.from_numpy(rng.standard_normal((n + 1, 3)) * 3).float()
        y = torch.from_numpy(rng.integers(0, 3, n + 1))
        z = int(rng.integers(0, n + 1))
        keep = [i for i in range(n + 1) if i != z]
        for aggregator in (
            RankAggregator(c1=c1, c2=c2, projection=projection, p=float(rng.uniform(0.1, 0.6))),
            ThresholdAggregator(c1=c1, c2=c2, projection=projection, tau=0.3),
        ):
            sums = [
                _flat(
                    aggregator.clipped_sum(
                        model,
                        X[rows],
                        y[rows],
                        step=trial,
                        loss="cross_entropy",
                        max_physical_batch_size=64,
                        generator=_rng(trial),
                    )
                )
                for rows in (list(range(n + 1)), keep)
            ]
            assert float((sums[0] - sums[1]).norm()) <= aggregator.sensitivity * (1 + 1e-5)


def test_an_empty_batch_gives_a_zero_sum_and_still_releases_the_noisy_count() -> None:
    model = build_model("logistic-regression", {}, input_shape=(8,), n_outputs=3, generator=_seeded(0))
    X, y = torch.zeros(0, 8), torch.zeros(0, dtype=torch.long)
    projection = StreamingProjection(k=5)
    tracker = ThresholdTracker(target_fraction=0.1, eta=0.2, count_noise_std=1.0, expected_batch_size=10.0)
    for aggregator in (
        RankAggregator(c1=1.0, c2=0.1, projection=projection),
        ThresholdAggregator(c1=1.0, c2=0.1, projection=projection, tau=0.5, tracker=tracker),
    ):
        total = aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=4, generator=_rng(1)
        )
        assert set(total) == {"1.weight", "1.bias"} and all(not bool(t.any()) for t in total.values())
    assert aggregator.tau != 0.5  # τ moved: the count's noise was drawn and released


def test_aggregator_sensitivities() -> None:
    """T15 on the worker side: Δ = 1.9 (rank) and 1.0 (threshold) for c1 = 1, c2 = 0.1."""
    projection = StreamingProjection(k=5)
    assert RankAggregator(c1=1.0, c2=0.1, projection=projection).sensitivity == pytest.approx(1.9)
    assert ThresholdAggregator(c1=1.0, c2=0.1, projection=projection).sensitivity == 1.0
    with pytest.raises(ValueError):
        RankAggregator(c1=0.1, c2=1.0, projection=projection)


# ----------------------------------------------------------------------------- T8 one noise draw


def _zero_gradient_problem(n: int, d: int, k: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, k, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.randn(k, d, generator=_seeded(5)))
    return model, torch.zeros(n, d), torch.randint(0, k, (n,), generator=_seeded(6))


@pytest.mark.parametrize("mode", ["rank", "threshold-tracking"])
def test_exactly_one_gaussian_vector_per_step(mode: str) -> None:
    """Replay the whole generator stream: Poisson, key, trace noise, (perm | count noise), ONE
    N(0, σ²Δ²) per parameter element — no per-sample noise anywhere."""
    n, d, k, steps, q, sigma, B = 60, 10, 6, 25, 0.2, 1.3, 12.0
    model, X, y = _zero_gradient_problem(n, d, k)
    projection = StreamingProjection(k=4)
    if mode == "rank":
        aggregator = RankAggregator(c1=1.0, c2=0.1, projection=projection, sigma_tr=0.3)
    else:
        tracker = ThresholdTracker(target_fraction=0.1, eta=0.2, count_noise_std=2.0, expected_batch_size=B)
        aggregator = ThresholdAggregator(c1=1.0, c2=0.1, projection=projection, sigma_tr=0.3, tracker=tracker)
    snapshots = [model[1].weight.detach().clone()]
    hooks = TrainingHooks(on_step_end=lambda _: snapshots.append(model[1].weight.detach().clone()))
    config = DPSGDConfig(
        steps=steps,
        sampling_probability=q,
        noise_multiplier=sigma,
        clipping_norm=1.0,
        learning_rate=1.0,
        max_physical_batch_size=8,
        expected_batch_size=B,
    )
    train_dp_sgd(model, X, y, config=config, generator=_rng(99), hooks=hooks, aggregator=aggregator)
    updates = -torch.diff(torch.stack(snapshots).double(), dim=0)

    replay = _rng(99)  # the projection key is derived, not drawn: no draw for it
    expected = []
    for _ in range(steps):
        size = int((replay.uniform(n, dtype=torch.float64) < q).sum())
        replay.normal(size, std=0.3, dtype=torch.float64)
        if mode == "rank":
            replay.permutation(size)
        else:
            replay.normal((), std=1.0, dtype=torch.float64)
        expected.append(replay.normal((k, d), std=1.0, dtype=torch.float32) * sigma * aggregator.sensitivity / B)
    torch.testing.assert_close(updates, torch.stack(expected).double(), rtol=0, atol=2e-5)


# ----------------------------------------------------------------------------- T9 calibration


N_ROWS, N_FEATURES = 2000, 1500


@pytest.mark.parametrize(
    ("name", "hyper"),
    [
        ("dc-dpsgd", {"c1": 1.0, "c2": 0.1}),
        ("dc-dpsgd-threshold", {"c1": 0.7, "c2": 0.1, "tracking": True, "threshold_noise_ratio": 1.0}),
    ],
)
def test_trainer_draws_the_charged_noise(name: str, hyper: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan with the API's code, run the registered trainer on zero inputs (weight gradients
    exactly 0) and recover the noise: Δw ~ N(0, T·(σΔ)²)·lr²/B² per coordinate."""
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[N_FEATURES], task="classification", n_classes=2)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": 2.0},
            "training": {"steps": 20, "batch_size": 100, "learning_rate": 0.5},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    event = privacy.event_from_json(plan.event_json)
    assert isinstance(event, privacy.PoissonSampledGaussianEvent) and event.count == 20
    sigma = plan.noise_multiplier
    if name == "dc-dpsgd":
        assert plan.plan.sensitivity == pytest.approx(1.9) and event.noise_multiplier == sigma
    else:
        assert plan.plan.sensitivity == pytest.approx(0.7)
        assert event.noise_multiplier == pytest.approx(sigma / math.sqrt(2), rel=1e-12)  # r = 1

    seen_trackers: list[ThresholdTracker] = []
    original = ThresholdTracker.next_tau

    def spy(self: ThresholdTracker, tau: float, count: int, generator: SecureRandom) -> float:
        seen_trackers.append(self)
        return original(self, tau, count, generator)

    monkeypatch.setattr(ThresholdTracker, "next_tau", spy)
    model = build_model("logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=_seeded(0))
    before = model[-1].weight.detach().clone()
    X = torch.zeros(N_ROWS, N_FEATURES)
    y = torch.randint(0, 2, (N_ROWS,), generator=_seeded(7))
    result = get_trainer(name)(
        TrainingRequest(
            model=model,
            features=TensorRows(X),
            y=y,
            task="classification",
            hyperparameters=plan.hyperparameters,
            training=plan.training,
            noise_multiplier=sigma,
            sampling_probability=plan.plan.sampling_probability,
            expected_batch_size=plan.plan.expected_batch_size,
            steps=plan.plan.steps,
            max_physical_batch_size=64,
            generator=_rng(1),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
        )
    )
    assert result.steps_run == 20
    change = (model[-1].weight.detach() - before).flatten().double().numpy()
    expected_std = 0.5 * math.sqrt(20) * plan.noise_std_on_sum / 100
    assert plan.noise_std_on_sum == pytest.approx(sigma * plan.plan.sensitivity)
    assert float(change.std()) == pytest.approx(expected_std, rel=0.05)
    statistic = float(np.sum((change / expected_std) ** 2))
    p_value = 2 * min(stats.chi2.cdf(statistic, change.size), stats.chi2.sf(statistic, change.size))
    assert p_value > 1e-3
    assert abs(float(change.mean())) < 4 * expected_std / math.sqrt(change.size)
    if name == "dc-dpsgd-threshold":
        # The released count's noise is σ_b = r·σ, the value σ_eff was computed from.
        assert len(seen_trackers) == 20
        assert all(t.count_noise_std == pytest.approx(1.0 * sigma, rel=1e-12) for t in seen_trackers)
        assert {t.expected_batch_size for t in seen_trackers} == {100.0}
    else:
        assert not seen_trackers


def test_tail_count_noise_has_std_sigma_b() -> None:
    """b̃ = (count + N(0, σ_b²))/B is recoverable from τ's update; its noise has std σ_b."""
    sigma_b, B, eta, p = 3.0, 50.0, 0.01, 0.1
    tracker = ThresholdTracker(target_fraction=p, eta=eta, count_noise_std=sigma_b, expected_batch_size=B)
    gen = _rng(8)
    tau, noise = 1.0, []
    for _ in range(4000):
        new = tracker.next_tau(tau, 5, gen)
        noise.append((math.log(new / tau) / eta + p) * B - 5)
        tau = new
    noise_t = torch.tensor(noise, dtype=torch.float64)
    assert float(noise_t.std()) == pytest.approx(sigma_b, rel=0.03)
    assert abs(float(noise_t.mean())) < 4 * sigma_b / math.sqrt(4000)


# ----------------------------------------------------------------------------- T10 tracking


def test_tracked_threshold_reaches_the_target_tail_fraction() -> None:
    gen = _rng(9)
    B, p = 256, 0.1
    rng = np.random.default_rng(10)  # synthetic traces λ ~ Beta(2, 30)
    tracker = ThresholdTracker(target_fraction=p, eta=0.2, count_noise_std=10.0, expected_batch_size=B)
    tau, fractions = 0.5, []
    for _ in range(3000):
        count = int(threshold_tail_mask(torch.from_numpy(rng.beta(2.0, 30.0, B)), tau).sum())
        fractions.append(count / B)
        tau = tracker.next_tau(tau, count, gen)
    assert abs(float(np.mean(fractions[1000:])) - p) < 0.02
    assert 0 < tau < 0.5


def test_rank_tail_fraction_is_floor_p_exactly_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[tuple[int, int]] = []
    original = dc_module.rank_tail_mask

    def spy(noisy: torch.Tensor, m: int, order: torch.Tensor) -> torch.Tensor:
        mask = original(noisy, m, order)
        sizes.append((noisy.numel(), int(mask.sum())))
        return mask

    monkeypatch.setattr(dc_module, "rank_tail_mask", spy)
    model = build_model("logistic-regression", {}, input_shape=(8,), n_outputs=3, generator=_seeded(0))
    X, y = torch.randn(300, 8, generator=_seeded(1)), torch.randint(0, 3, (300,), generator=_seeded(2))
    aggregator = RankAggregator(c1=1.0, c2=0.1, projection=StreamingProjection(k=5), p=0.1)
    config = DPSGDConfig(steps=15, sampling_probability=0.2, noise_multiplier=1.0, clipping_norm=1.9, learning_rate=0.1)
    train_dp_sgd(model, X, y, config=config, generator=_rng(3), aggregator=aggregator)
    assert len(sizes) == 15
    assert all(tail == math.floor(0.1 * size) for size, tail in sizes)


# ----------------------------------------------------------------------------- resume


def _threshold_request(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, seed: int, hooks: TrainingHooks, resume: TrainingState | None
) -> TrainingRequest:
    hyperparameters = get_algorithm("dc-dpsgd-threshold").validate_hyperparameters(
        {"c2": 0.02, "c1": 0.5, "k": 6, "tracking": True, "eta_tau": 0.5, "threshold_noise_ratio": 2.0, "momentum": 0.5}
    )
    training = TrainingSpec(steps=12, batch_size=15, learning_rate=0.3)
    return TrainingRequest(
        model=model,
        features=TensorRows(X),
        y=y,
        task="classification",
        hyperparameters=hyperparameters,
        training=training,
        noise_multiplier=0.8,
        sampling_probability=0.25,
        expected_batch_size=15.0,
        steps=12,
        max_physical_batch_size=16,
        generator=_rng(seed),
        hooks=hooks,
        resume_from=resume,
        device=torch.device("cpu"),
    )


def test_tracked_threshold_survives_checkpoint_and_resume(tmp_path: Path) -> None:
    def problem(init: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
        model = build_model("mlp", {"hidden_sizes": [8]}, input_shape=(5,), n_outputs=3, generator=_seeded(init))
        return model, torch.randn(60, 5, generator=_seeded(100)) * 3, torch.randint(0, 3, (60,), generator=_seeded(101))

    trainer = get_trainer("dc-dpsgd-threshold")
    reference, X, y = problem()
    trainer(_threshold_request(reference, X, y, seed=42, hooks=TrainingHooks(), resume=None))

    checkpoints: list[TrainingState] = []

    def save(state: TrainingState) -> None:
        path = tmp_path / f"ckpt-{state.step}.safetensors"
        save_training_state(path, state)
        checkpoints.append(load_training_state(path))

    interrupted, _, _ = problem()
    done: list[int] = []
    hooks = TrainingHooks(
        save_checkpoint=save, checkpoint_every=5, on_step_end=done.append, should_stop=lambda: len(done) == 7
    )
    assert trainer(_threshold_request(interrupted, X, y, seed=42, hooks=hooks, resume=None)).stopped_early
    saved_tau = checkpoints[0].optimizer_state["param_groups"][0][TAU_CHECKPOINT_KEY]
    assert isinstance(saved_tau, float) and saved_tau != 6 / sum(p.numel() for p in reference.parameters())

    resumed, _, _ = problem(init=9)
    trainer(_threshold_request(resumed, X, y, seed=12345, hooks=TrainingHooks(), resume=checkpoints[0]))
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)

    # Without the saved τ tracking restarts from τ_0 — a different (still private) trajectory.
    stripped = checkpoints[0]
    del stripped.optimizer_state["param_groups"][0][TAU_CHECKPOINT_KEY]
    restarted, _, _ = problem(init=9)
    trainer(_threshold_request(restarted, X, y, seed=12345, hooks=TrainingHooks(), resume=stripped))
    assert any(not torch.equal(a, b) for a, b in zip(restarted.parameters(), reference.parameters(), strict=True))


def test_rank_result_does_not_depend_on_the_chunk_size() -> None:
    def run(chunk: int) -> torch.Tensor:
        model = build_model("mlp", {"hidden_sizes": [5]}, input_shape=(4,), n_outputs=3, generator=_seeded(0)).double()
        X = torch.randn(50, 4, generator=_seeded(1), dtype=torch.float64)
        y = torch.randint(0, 3, (50,), generator=_seeded(2))
        aggregator = RankAggregator(c1=0.5, c2=0.05, projection=StreamingProjection(k=7), p=0.2)
        config = DPSGDConfig(
            steps=5,
            sampling_probability=0.5,
            noise_multiplier=1.0,
            clipping_norm=0.95,
            learning_rate=0.1,
            max_physical_batch_size=chunk,
        )
        train_dp_sgd(model, X, y, config=config, generator=_rng(3), aggregator=aggregator)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    torch.testing.assert_close(run(3), run(256), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("mode", ["rank", "threshold-tracking"])
def test_ghost_and_vmap_engines_train_identically_on_a_conv_net(mode: str) -> None:
    """The engines differ only in rounding: same splits, same sums, so the same trained model (float64;
    conv, GroupNorm and Linear layers, chunks that split the batch)."""

    def run(engine: str) -> tuple[torch.Tensor, float | None]:
        model = build_model(
            "cnn2-gn", {"groups": 2}, input_shape=(1, 14, 14), n_outputs=3, generator=_seeded(0)
        ).double()
        X = torch.randn(24, 1, 14, 14, generator=_seeded(1), dtype=torch.float64)
        y = torch.randint(0, 3, (24,), generator=_seeded(2))
        projection = StreamingProjection(k=9, block_rows=500)
        aggregator: RankAggregator | ThresholdAggregator
        if mode == "rank":
            aggregator = RankAggregator(c1=0.5, c2=0.05, projection=projection, sigma_tr=0.01, p=0.25, engine=engine)
        else:
            tracker = ThresholdTracker(target_fraction=0.25, eta=0.5, count_noise_std=1.0, expected_batch_size=12.0)
            aggregator = ThresholdAggregator(
                c1=0.5, c2=0.05, projection=projection, sigma_tr=0.01, tracker=tracker, engine=engine
            )
        config = DPSGDConfig(
            steps=4,
            sampling_probability=0.5,
            noise_multiplier=1.0,
            clipping_norm=aggregator.sensitivity,
            learning_rate=0.1,
            max_physical_batch_size=5,
        )
        train_dp_sgd(model, X, y, config=config, generator=_rng(3), aggregator=aggregator)
        tau = aggregator.tau if isinstance(aggregator, ThresholdAggregator) else None
        return torch.cat([p.detach().flatten() for p in model.parameters()]), tau

    (ghost, ghost_tau), (vmap, vmap_tau) = run("ghost"), run("vmap")
    initial = torch.cat([p.detach().flatten() for p in build_model(
        "cnn2-gn", {"groups": 2}, input_shape=(1, 14, 14), n_outputs=3, generator=_seeded(0)
    ).double().parameters()])  # fmt: skip
    assert not torch.allclose(ghost, initial)  # it trained
    torch.testing.assert_close(ghost, vmap, rtol=1e-9, atol=1e-12)
    if mode == "rank":
        assert ghost_tau is None and vmap_tau is None
    else:
        assert ghost_tau is not None and ghost_tau == pytest.approx(vmap_tau, rel=1e-12)


def test_auto_engine_uses_ghost_where_it_is_exact_and_vmap_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    import dp.per_example.engines as engines

    used: list[str] = []

    def spy(name: str, real: object) -> object:
        def wrapped(*args: object, **kwargs: object) -> object:
            used.append(name)
            return real(*args, **kwargs)  # type: ignore[operator]

        return wrapped

    monkeypatch.setattr(engines, "iter_ghost_per_sample_grads", spy("ghost", engines.iter_ghost_per_sample_grads))
    monkeypatch.setattr(engines, "iter_per_sample_grads", spy("vmap", engines.iter_per_sample_grads))
    supported = build_model("mlp", {"hidden_sizes": [4]}, input_shape=(3,), n_outputs=2, generator=_seeded(0))
    X, y = torch.randn(6, 3, generator=_seeded(1)), torch.randint(0, 2, (6,), generator=_seeded(2))
    aggregator = RankAggregator(c1=1.0, c2=0.5, projection=StreamingProjection(k=3), p=0.5)
    aggregator.clipped_sum(supported, X, y, step=0, loss="cross_entropy", max_physical_batch_size=6, generator=_rng(1))
    assert used == ["ghost"]
    monkeypatch.setattr(engines, "ghost_supports", lambda model: False)
    aggregator.clipped_sum(supported, X, y, step=0, loss="cross_entropy", max_physical_batch_size=6, generator=_rng(1))
    assert used == ["ghost", "vmap"]
    with pytest.raises(ValueError, match="engine must be one of"):
        RankAggregator(c1=1.0, c2=0.5, projection=StreamingProjection(k=3), engine="opacus")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- learning


@pytest.mark.parametrize("name", ["dc-dpsgd", "dc-dpsgd-threshold"])
def test_dc_dpsgd_learns_digits(name: str) -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    X_train_t = torch.tensor(scaler.transform(X_train), dtype=torch.float32)
    X_test_t = torch.tensor(scaler.transform(X_test), dtype=torch.float32)
    model = build_model("logistic-regression", {}, input_shape=(64,), n_outputs=10, generator=_seeded(0))
    hyper: dict = {"c2": 0.25, "c1": 1.0, "k": 200}
    if name == "dc-dpsgd-threshold":
        hyper |= {"tracking": True}
    q = 0.05
    result = get_trainer(name)(
        TrainingRequest(
            model=model,
            features=TensorRows(X_train_t),
            y=torch.tensor(y_train),
            task="classification",
            hyperparameters=get_algorithm(name).validate_hyperparameters(hyper),
            training=TrainingSpec(steps=300, batch_size=round(q * len(X_train)), learning_rate=1.0),
            noise_multiplier=1.0,
            sampling_probability=q,
            expected_batch_size=q * len(X_train),
            steps=300,
            max_physical_batch_size=256,
            generator=_rng(1),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
        )
    )
    assert result.steps_run == 300
    model.eval()
    with torch.no_grad():
        accuracy = (model(X_test_t).argmax(dim=1) == torch.tensor(y_test)).float().mean().item()
    assert accuracy > 0.75, accuracy
