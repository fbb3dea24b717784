"""bf16 mixed precision in the per-sample gradient engines: bf16 forward, float32 norms and sums.

What must hold: "fp32" (the default) is exactly what the engines did before; under "bf16" the
forward really runs in bfloat16, yet every row's clipped contribution has norm C up to float32
rounding (not bfloat16's), the results are float32, and the two engines agree with each other and
with float32 within bfloat16's accuracy. CPU autocast runs the same path a GPU would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from dp.loop.batch_loop import PerSampleMapAggregator, per_sample_map_aggregator
from dp.per_example.ghost import (
    GhostClipAggregator,
    ghost_clipped_grad_sum,
    ghost_per_sample_norms,
    ghost_weighted_grad_sums,
)
from dp.per_example.per_sample import (
    AbadiClip,
    PerSampleMap,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
)
from dp.precision import PRECISIONS, accumulation_view, autocast_context, check_precision
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model

LOSS = "cross_entropy"

# (id, model name, params, input_shape (C, H, W), n_outputs): the tiny zoo of the ghost tests.
TINY = [
    ("cnn", "cnn", {"channels": [4, 8], "groups": 2, "activation": "tanh", "pooling": "avg"}, (3, 8, 8), 3),
    ("resnet-gn", "resnet-gn", {"blocks": [1, 1], "width": 4, "groups": 2}, (3, 8, 8), 3),
    ("wrn-ws", "wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, (3, 8, 8), 3),
    ("vit", "vit", {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12}, (3, 8, 8), 3),
]
IDS = [case[0] for case in TINY]


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """Tiny tensors: one thread is faster and immune to a busy shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny(case: tuple, n: int = 6, seed: int = 7) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    _, name, params, input_shape, n_outputs = case
    gen = torch.Generator().manual_seed(seed)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen)
    X = torch.randn(n, *input_shape, generator=gen)
    y = torch.randint(0, n_outputs, (n,), generator=gen)
    return model, X, y


def _flat_norm(grads: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(g.double().square().sum() for g in grads.values())))


def _rel_diff(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    assert list(got) == list(ref)
    return _flat_norm({k: got[k].double() - ref[k].double() for k in ref}) / _flat_norm(ref)


@dataclass(frozen=True)
class OneRow:
    """The inner map's scales for row `row` of the chunk, 0 for every other row: the engine's result
    is then exactly the contribution it adds for that one row, inside a full-batch computation."""

    inner: PerSampleMap
    row: int

    @property
    def norm_bound(self) -> float:
        return self.inner.norm_bound

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        keep = torch.arange(norms.shape[0], device=norms.device) == self.row
        return torch.where(keep, self.inner.scale_factors(norms), 0.0)


# ----------------------------------------------------------------------------- the helper module


def test_precision_choices_and_contexts() -> None:
    assert PRECISIONS == ("fp32", "bf16")
    with pytest.raises(ValueError, match="precision must be one of"):
        check_precision("fp16")
    a = torch.randn(3, 4)
    with autocast_context("fp32", device_type="cpu"):
        assert (a @ a.T).dtype == torch.float32
    with autocast_context("bf16", device_type="cpu"):
        assert (a @ a.T).dtype == torch.bfloat16
    half = a.to(torch.bfloat16)
    assert accumulation_view("bf16", half).dtype == torch.float32
    assert accumulation_view("fp32", half) is half
    idx = torch.tensor([1, 2])
    assert accumulation_view("bf16", idx) is idx  # indices stay integers


# ----------------------------------------------------------------------------- fp32 is unchanged


def test_fp32_default_is_bit_identical_and_never_autocasts(monkeypatch: pytest.MonkeyPatch) -> None:
    model, X, y = _tiny(TINY[0])
    clip = AbadiClip(0.5)
    ghost = {
        mode: ghost_clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=4, pass2=mode)
        for mode in ("bk", "retain", "recompute")
    }
    vmap = clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=4)
    norms = ghost_per_sample_norms(model, X, y, loss=LOSS, max_physical_batch_size=4)
    weighted = ghost_weighted_grad_sums(model, X, y, loss=LOSS, per_sample_maps=[clip], max_physical_batch_size=4)

    def no_autocast(*args: object, **kwargs: object) -> None:
        raise AssertionError("fp32 must not enter autocast")

    monkeypatch.setattr(torch, "autocast", no_autocast)
    kw = {"loss": LOSS, "max_physical_batch_size": 4, "precision": "fp32"}
    for mode in ("bk", "retain", "recompute"):
        got = ghost_clipped_grad_sum(model, X, y, per_sample_map=clip, pass2=mode, **kw)  # type: ignore[arg-type]
        assert all(torch.equal(got[k], ghost[mode][k]) for k in got)
        assert _rel_diff(got, vmap) < 1e-5  # float32 accuracy, far below bf16's
    got = clipped_grad_sum(model, X, y, per_sample_map=clip, **kw)  # type: ignore[arg-type]
    assert all(torch.equal(got[k], vmap[k]) for k in vmap)
    assert torch.equal(ghost_per_sample_norms(model, X, y, **kw), norms)  # type: ignore[arg-type]
    again = ghost_weighted_grad_sums(model, X, y, per_sample_maps=[clip], **kw)  # type: ignore[arg-type]
    assert all(torch.equal(again[0][k], weighted[0][k]) for k in weighted[0])


# ----------------------------------------------------------------------------- bf16 results


@pytest.mark.parametrize("case", TINY, ids=IDS)
def test_bf16_engines_agree_with_each_other_and_with_fp32(case: tuple) -> None:
    model, X, y = _tiny(case)
    ref_norms = ghost_per_sample_norms(model, X, y, loss=LOSS, max_physical_batch_size=6)
    clip = AbadiClip(float(ref_norms.median()))  # about half of the rows clipped
    fp32 = ghost_clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=6)
    ghost = ghost_clipped_grad_sum(
        model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=4, precision="bf16"
    )
    vmap = clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=4, precision="bf16")
    for result in (ghost, vmap):
        assert all(g.dtype == torch.float32 for g in result.values())
        assert all(bool(torch.isfinite(g).all()) for g in result.values())
    assert _rel_diff(ghost, vmap) < 2e-2  # same bf16 forward, float32 per-sample algebra
    # bf16 is really used (float32 agrees to ~1e-6), and it stays a good approximation; the deep
    # GroupNorm/weight-standardised nets round the most (on CPU autocast also runs GroupNorm in bf16).
    assert 1e-4 < _rel_diff(ghost, fp32) < 0.2
    norms = ghost_per_sample_norms(model, X, y, loss=LOSS, max_physical_batch_size=4, precision="bf16")
    vmap_norms = torch.cat(
        [
            per_sample_norms(g)
            for g in iter_per_sample_grads(model, X, y, loss=LOSS, max_physical_batch_size=4, precision="bf16")
        ]
    )
    assert norms.dtype == vmap_norms.dtype == torch.float32
    torch.testing.assert_close(norms, vmap_norms, rtol=2e-2, atol=0.0)
    torch.testing.assert_close(norms, ref_norms, rtol=0.15, atol=0.0)
    assert all(p.grad is None and p.dtype == torch.float32 for p in model.parameters())
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("case", [TINY[0], TINY[3]], ids=["cnn", "vit"])
def test_bf16_sums_are_close_to_fp32(case: tuple) -> None:
    """Shallow nets: bf16's relative error on the clipped sum is at the percent level."""
    model, X, y = _tiny(case, n=8, seed=3)
    clip = AbadiClip(1.0)
    fp32 = clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=8)
    bf16 = ghost_clipped_grad_sum(
        model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=8, precision="bf16"
    )
    assert _rel_diff(bf16, fp32) < 3e-2


def test_bf16_embedding_and_dense_linear_paths() -> None:
    model = nn.Sequential(nn.Embedding(11, 4), nn.Flatten(), nn.Linear(12, 5), nn.Tanh(), nn.Linear(5, 3))
    gen = torch.Generator().manual_seed(1)
    X = torch.randint(0, 11, (7, 3), generator=gen)
    y = torch.randint(0, 3, (7,), generator=gen)
    clip = AbadiClip(0.3)
    kw = {"loss": LOSS, "per_sample_map": clip, "max_physical_batch_size": 3}
    ghost = ghost_clipped_grad_sum(model, X, y, precision="bf16", **kw)  # type: ignore[arg-type]
    vmap = clipped_grad_sum(model, X, y, precision="bf16", **kw)  # type: ignore[arg-type]
    fp32 = clipped_grad_sum(model, X, y, **kw)  # type: ignore[arg-type]
    assert all(g.dtype == torch.float32 for g in ghost.values())
    assert _rel_diff(ghost, vmap) < 2e-2
    assert 1e-4 < _rel_diff(ghost, fp32) < 3e-2


# ----------------------------------------------------------------------------- the clipping bound


@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case_index=st.integers(0, len(TINY) - 1),
    log_input_scale=st.floats(-3.0, 3.0),
    clip_fraction=st.floats(0.01, 0.95),
    row=st.integers(0, 4),
    engine=st.sampled_from(["ghost", "vmap"]),
)
def test_bf16_each_row_contribution_is_clipped_in_float32(
    case_index: int, log_input_scale: float, clip_fraction: float, row: int, engine: str
) -> None:
    """The contribution added for one row of a full batch has norm C up to float32 rounding: the
    norm that scaled it was computed, in float32, from exactly what was added (bf16 rounding, about
    4e-3, would show here)."""
    model, X, y = _tiny(TINY[case_index], n=5, seed=case_index)
    X = X * 10.0**log_input_scale
    norms = ghost_per_sample_norms(model, X, y, loss=LOSS, max_physical_batch_size=5, precision="bf16")
    assert bool(torch.isfinite(norms).all()) and float(norms[row]) > 0
    c = float(norms[row]) * clip_fraction  # row `row` is clipped
    one_row = OneRow(AbadiClip(c), row)
    if engine == "ghost":
        got = ghost_clipped_grad_sum(
            model, X, y, loss=LOSS, per_sample_map=one_row, max_physical_batch_size=5, precision="bf16"
        )
    else:
        got = clipped_grad_sum(
            model, X, y, loss=LOSS, per_sample_map=one_row, max_physical_batch_size=5, precision="bf16"
        )
    assert all(g.dtype == torch.float32 for g in got.values())
    norm = _flat_norm(got)
    assert norm <= c * (1 + 1e-5)
    assert norm >= c * (1 - 1e-4)  # clipped to C itself, not to a bf16-rounded estimate of it


# ----------------------------------------------------------------------------- refusals and wiring


def test_bf16_refuses_second_backward_modes_outer_autocast_and_non_float32_parameters() -> None:
    model, X, y = _tiny(TINY[0], n=3)
    clip = AbadiClip(1.0)
    for mode in ("retain", "recompute"):
        with pytest.raises(ValueError, match="not offered with precision='bf16'"):
            ghost_clipped_grad_sum(
                model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=3, pass2=mode, precision="bf16"
            )
        with pytest.raises(ValueError, match="not offered"):
            GhostClipAggregator(clip, pass2=mode, precision="bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="precision must be one of"):
        ghost_clipped_grad_sum(
            model,
            X,
            y,
            loss=LOSS,
            per_sample_map=clip,
            max_physical_batch_size=3,
            precision="fp16",  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="precision must be one of"):
        per_sample_map_aggregator(model, clip, precision="half")  # type: ignore[arg-type]
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="inside an autocast region"):
        ghost_clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=3)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="inside an autocast region"):
        clipped_grad_sum(model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=3, precision="bf16")
    double = copy.deepcopy(model).double()
    with pytest.raises(ValueError, match="needs float32 parameters"):
        ghost_per_sample_norms(double, X.double(), y, loss=LOSS, max_physical_batch_size=3, precision="bf16")
    with pytest.raises(ValueError, match="needs float32 parameters"):
        next(iter_per_sample_grads(double, X.double(), y, loss=LOSS, max_physical_batch_size=3, precision="bf16"))


def test_bf16_weighted_sums_share_one_pass_with_the_clipped_sum() -> None:
    model, X, y = _tiny(TINY[3], n=5)
    maps = [AbadiClip(0.3), OneRow(AbadiClip(0.3), 2)]
    kw = {"loss": LOSS, "max_physical_batch_size": 3, "precision": "bf16"}
    sums = ghost_weighted_grad_sums(model, X, y, per_sample_maps=maps, **kw)  # type: ignore[arg-type]
    for per_sample_map, got in zip(maps, sums, strict=True):
        alone = ghost_clipped_grad_sum(model, X, y, per_sample_map=per_sample_map, **kw)  # type: ignore[arg-type]
        assert all(g.dtype == torch.float32 and torch.equal(g, alone[k]) for k, g in got.items())
    assert _flat_norm(sums[1]) == pytest.approx(0.3, rel=1e-5)


def test_aggregators_pass_the_precision_through() -> None:
    model, X, y = _tiny(TINY[0], n=5)
    clip = AbadiClip(0.5)
    ghost_agg = per_sample_map_aggregator(model, clip, precision="bf16")
    assert isinstance(ghost_agg, GhostClipAggregator) and ghost_agg.precision == "bf16"
    assert isinstance(per_sample_map_aggregator(model, clip), GhostClipAggregator)
    assert per_sample_map_aggregator(model, clip).precision == "fp32"  # type: ignore[attr-defined]

    torch.manual_seed(0)  # nn.Linear's own initialisation: any values do
    shared = nn.Linear(4, 4)
    tied = nn.Sequential(shared, nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3))
    tied[2].weight = shared.weight  # tied across layers: only the vmap engine takes it
    vmap_agg = per_sample_map_aggregator(tied, clip, precision="bf16")
    assert isinstance(vmap_agg, PerSampleMapAggregator) and vmap_agg.precision == "bf16"

    kw = {"step": 0, "loss": LOSS, "max_physical_batch_size": 5, "generator": SecureRandom.from_seed(0)}
    got = ghost_agg.clipped_sum(model, X, y, **kw)  # type: ignore[arg-type]
    direct = ghost_clipped_grad_sum(
        model, X, y, loss=LOSS, per_sample_map=clip, max_physical_batch_size=5, precision="bf16"
    )
    assert all(torch.equal(got[k], direct[k]) for k in direct)

    Xs = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    ys = torch.tensor([0, 1, 2, 0, 1])
    got = vmap_agg.clipped_sum(tied, Xs, ys, **kw)  # type: ignore[arg-type]
    fp32 = PerSampleMapAggregator(clip).clipped_sum(tied, Xs, ys, **kw)  # type: ignore[arg-type]
    assert all(g.dtype == torch.float32 for g in got.values())
    assert 1e-5 < _rel_diff(got, fp32) < 3e-2
