"""The ghost clipping / book-keeping engine against the vmap engine (per_sample.py).

The vmap engine is itself pinned against one-row-at-a-time autograd in test_worker_per_sample.py,
so equality with it (norms and clipped sums) is equality with the definition.
"""

from __future__ import annotations

import copy
import gc
import math
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, per_sample_map_aggregator, train_dp_sgd
from dp.per_example.ghost import (
    GhostClipAggregator,
    check_ghost_supported,
    ghost_clipped_grad_sum,
    ghost_per_sample_norms,
    ghost_weighted_grad_sums,
    iter_ghost_per_sample_grads,
    linear_conv,
    support,
    supports,
)
from dp.per_example.ghost import embedding as embedding_rules
from dp.per_example.ghost import engine as ghost_engine
from dp.per_example.ghost.recorder import Recorder
from dp.per_example.ghost.work import LayerWork
from dp.per_example.per_sample import (
    AbadiClip,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
    trainable_parameters,
)
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model
from tests.unit.worker.per_sample_grads_check import assert_ghost_per_sample_grads_match

MODES = ("bk", "retain", "recompute")


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}

# (id, model name, params, input_shape, n_outputs, loss)
ZOO = [
    ("logistic", "logistic-regression", {}, (5,), 3, "cross_entropy"),
    ("linear-mse", "linear-regression", {}, (4,), 1, "mse"),
    ("mlp-tanh", "mlp", {"hidden_sizes": [6, 4], "activation": "tanh"}, (5,), 3, "cross_entropy"),
    ("mlp-relu-mse", "mlp", {"hidden_sizes": [7], "activation": "relu"}, (3,), 1, "mse"),
    ("cnn2-gn-16", "cnn2-gn", {"groups": 4}, (1, 16, 16), 4, "cross_entropy"),
    ("cnn2-gn-28", "cnn2-gn", {"groups": 4}, (1, 28, 28), 10, "cross_entropy"),
    ("cnn2-gn-flat", "cnn2-gn", {"groups": 2, "image_shape": [1, 16, 16]}, (256,), 4, "cross_entropy"),
]


@dataclass(frozen=True)
class NormalisingMap:
    """A PerSampleMap other than Abadi (Auto-S form): every row is rescaled, S = C."""

    clipping_norm: float
    gamma: float = 0.01

    @property
    def norm_bound(self) -> float:
        return self.clipping_norm

    def scale_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return self.clipping_norm / (norms + self.gamma)


def _zoo(case: tuple, dtype: torch.dtype, n: int = 10) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    _, name, params, input_shape, n_outputs, loss = case
    gen = torch.Generator().manual_seed(1234)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen).to(dtype)
    X = torch.randn(n, *input_shape, generator=gen, dtype=dtype)
    if loss == "cross_entropy":
        y = torch.randint(0, n_outputs, (n,), generator=gen)
    else:
        y = torch.randn(n, generator=gen, dtype=dtype)
    return model, X, y, loss


def _vmap_norms(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: str) -> torch.Tensor:
    return torch.cat(
        [per_sample_norms(g) for g in iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=4)]
    )


def _assert_sums_close(
    got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], tol: float, *, atol: float = 0.0
) -> None:
    """``atol``: a difference that is rounding noise whatever the sums' size (a tiny fraction of
    the largest norm the clipped sum can have), for a batch whose gradients all vanish but for
    rounding."""
    assert list(got) == list(ref)
    # A parameter whose reference sum is exactly zero (e.g. the bias of a one-output softmax) is
    # compared against a tiny fraction of the whole sum's size, not against zero.
    total = math.sqrt(sum(float(r.norm()) ** 2 for r in ref.values()))
    for name, r in ref.items():
        g = got[name]
        assert g.shape == r.shape and g.dtype == r.dtype, name
        assert bool(torch.isfinite(g).all()), name
        scale = float(r.norm()) + 1e-6 * total + 1e-30
        assert float((g - r).norm()) <= tol * scale + atol, (name, float((g - r).norm()) / scale)


def _check_against_vmap(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    loss: str,
    *,
    chunks: tuple[int, ...] = (3, 64),
    per_sample_map: object = None,
    modes: tuple[str, ...] = MODES,
) -> torch.Tensor:
    """Norms and clipped sums of every pass-2 mode and chunking equal the vmap engine's."""
    dtype = next(model.parameters()).dtype
    tol = TOL[dtype]
    # A copy: functional_call leaves a layer that is called twice with plain-tensor weights.
    vmap_model = copy.deepcopy(model)
    ref_norms = _vmap_norms(vmap_model, X, y, loss)
    finite = torch.isfinite(ref_norms)
    if per_sample_map is None:
        # About half of the (finite) rows get clipped.
        per_sample_map = AbadiClip(float(ref_norms[finite].median()) if bool(finite.any()) else 1.0)
    reference = clipped_grad_sum(vmap_model, X, y, loss=loss, per_sample_map=per_sample_map, max_physical_batch_size=4)
    for chunk in chunks:
        norms = ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=chunk)
        assert norms.shape == ref_norms.shape
        assert torch.equal(torch.isfinite(norms), finite)
        torch.testing.assert_close(norms[finite], ref_norms[finite], rtol=tol, atol=tol * 1e-3)
        for mode in modes:
            got = ghost_clipped_grad_sum(
                model, X, y, loss=loss, per_sample_map=per_sample_map, max_physical_batch_size=chunk, pass2=mode
            )
            _assert_sums_close(got, reference, tol)
        assert_ghost_per_sample_grads_match(model, X, y, loss, chunk=chunk, tol=tol)
    return ref_norms


@contextmanager
def _force(gram: bool | None = None) -> Iterator[None]:
    """Force the Gram or the materialised rule."""
    with mock.patch.object(
        linear_conv, "_use_gram", (lambda *a, **k: gram) if gram is not None else linear_conv._use_gram
    ):
        yield


# ----------------------------------------------------------------------------- the model zoo


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", ZOO, ids=[c[0] for c in ZOO])
def test_zoo_models_match_vmap_engine(case: tuple, dtype: torch.dtype) -> None:
    model, X, y, loss = _zoo(case, dtype)
    norms = _check_against_vmap(model, X, y, loss)
    assert bool((norms > 0).all())  # not trivially zero
    for p in model.parameters():
        assert p.grad is None  # .grad is never touched
    for m in model.modules():
        assert not m._forward_hooks  # hooks are removed


@pytest.mark.parametrize("gram", [True, False])
def test_cnn_both_conv_rules_match(gram: bool) -> None:
    model, X, y, loss = _zoo(ZOO[5], torch.float64, n=6)
    with _force(gram=gram):
        _check_against_vmap(model, X, y, loss, chunks=(4,), modes=("bk",))


def test_another_per_sample_map_and_a_single_chunk_per_row() -> None:
    model, X, y, loss = _zoo(ZOO[4], torch.float64, n=5)
    _check_against_vmap(model, X, y, loss, chunks=(1,), per_sample_map=NormalisingMap(0.3))


# ----------------------------------------------------------------------------- awkward rows


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", [ZOO[1], ZOO[2], ZOO[4]], ids=["linear-mse", "mlp", "cnn"])
def test_huge_zero_and_non_finite_rows(case: tuple, dtype: torch.dtype) -> None:
    model, X, y, loss = _zoo(case, dtype, n=9)
    X = X.clone()
    X[1] *= 1e4  # huge but finite gradient: clipped hard
    X[2] = float("nan")
    X[3].view(-1)[0] = float("inf")
    if case[0] == "linear-mse":
        X[4] = 0.0  # output = bias exactly: zero residual, zero gradient
        y = y.clone()
        y[4] = model[1].bias.detach()[0]
        X[5] *= 1e30 if dtype == torch.float32 else 1e200  # finite input, gradient overflows
    norms = _check_against_vmap(model, X, y, loss, chunks=(4, 9))
    assert not bool(torch.isfinite(norms[2:4]).any())
    if case[0] == "linear-mse":
        assert float(norms[4]) == 0.0 and not bool(torch.isfinite(norms[5]))
    # Non-finite rows contribute exactly nothing: the sum equals the sum over the clean rows.
    keep = torch.isfinite(norms)
    clip = AbadiClip(1.0)
    clean = ghost_clipped_grad_sum(model, X[keep], y[keep], loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    for mode in MODES:
        got = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=4, pass2=mode)
        _assert_sums_close(got, clean, TOL[dtype])


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "materialise"])
def test_non_finite_rows_add_nothing_in_either_conv_form(gram: bool) -> None:
    """The Gram form's conv sum runs the convolution's own weight-gradient kernel on the whole
    chunk: a non-finite row must be zeroed in both its input and its output gradient first."""
    model, X, y, loss = _zoo(ZOO[5], torch.float64, n=7)
    X = X.clone()
    X[2] = float("nan")
    X[5].view(-1)[3] = float("inf")
    clip = AbadiClip(1.0)
    keep = torch.ones(7, dtype=torch.bool)
    keep[[2, 5]] = False
    with _force(gram=gram):
        clean = ghost_clipped_grad_sum(
            model, X[keep], y[keep], loss=loss, per_sample_map=clip, max_physical_batch_size=7
        )
        got = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=7)
    _assert_sums_close(got, clean, TOL[torch.float64])


def _row_by_row_sum(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, per_sample_map: object
) -> dict[str, torch.Tensor]:
    """Σ_i scale_i·g_i with each row's gradient from its own autograd call (non-finite rows skipped)."""
    params = trainable_parameters(model)
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    for i in range(X.shape[0]):
        loss = F.cross_entropy(model(X[i : i + 1]), y[i : i + 1], reduction="sum")
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values())), strict=True))
        norm = torch.cat([g.flatten() for g in grads.values()]).norm()
        if not bool(torch.isfinite(norm)):
            continue
        scale = per_sample_map.scale_factors(norm.view(1))[0]  # type: ignore[attr-defined]
        for name, g in grads.items():
            total[name] += scale * g
    return total


class _TwiceGroupedConv(nn.Module):
    """A grouped conv called twice (its calls are stacked) before a head: the Gram form's weighted
    sums with m weightings stacked in each group's output channels."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.head = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.conv(torch.tanh(self.conv(x[:, :4]))[:, :4] + x[:, 4:8])).flatten(1))


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "materialise"])
def test_several_weightings_of_a_grouped_reused_conv_equal_their_separate_sums(
    gram: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(support, "GHOST_CONTAINERS", {*support.GHOST_CONTAINERS, _TwiceGroupedConv})
    torch.manual_seed(0)
    model = _TwiceGroupedConv().double()
    X = torch.randn(7, 8, 5, 5, dtype=torch.float64) * 2
    X[3] = float("nan")  # a non-finite row: weight 0 in every weighting
    y = torch.randint(0, 3, (7,))
    maps = (AbadiClip(0.05), NormalisingMap(0.3), AbadiClip(1e9))
    kwargs = {"loss": "cross_entropy", "max_physical_batch_size": 4}
    with _force(gram=gram):
        together = ghost_weighted_grad_sums(model, X, y, per_sample_maps=maps, **kwargs)  # type: ignore[arg-type]
        for per_sample_map, result in zip(maps, together, strict=True):
            alone = ghost_clipped_grad_sum(model, X, y, per_sample_map=per_sample_map, **kwargs)  # type: ignore[arg-type]
            _assert_sums_close(result, alone, 1e-12)
            _assert_sums_close(result, _row_by_row_sum(model, X, y, per_sample_map), 1e-10)


def test_the_chunk_check_finds_non_finite_rows_and_survives_an_overflowing_sum() -> None:
    """One reduction decides whether any row's norm is non-finite; a sum that overflows while
    every row is finite must not zero a row, and a NaN or inf row must get scale 0 in every map.
    The squared norms are float64 (dp/per_example/clip_margin.py), the scales the parameters' dtype."""
    from dp.per_example.clip_margin import norm_upper_bound
    from dp.per_example.ghost.api import _chunk_scales

    maps = (AbadiClip(1.0), NormalisingMap(0.5))
    f32 = {"dtype": torch.float32, "terms": 10}
    # float64 parameters: each squared norm finite, their sum not (with float32 ones a float64 sum
    # of squares cannot overflow; a norm beyond float32's range is not finite and maps to 0).
    f64 = {"dtype": torch.float64, "terms": 10}
    huge = torch.tensor([1e308, 1e308, 0.25], dtype=torch.float64)
    scales, finite = _chunk_scales(huge, maps, **f64)
    assert finite is None
    expected = torch.stack([m.scale_factors(norm_upper_bound(huge, **f64)) for m in maps])
    assert torch.equal(scales, expected) and scales.dtype == torch.float64
    assert (scales > 0).all()

    for bad in (float("nan"), float("inf")):
        sq = torch.tensor([4.0, bad, 0.25], dtype=torch.float64)
        scales, finite = _chunk_scales(sq, maps, **f32)
        assert finite is not None and finite.tolist() == [True, False, True]
        assert scales[:, 1].tolist() == [0.0, 0.0]
        unmasked = torch.stack([m.scale_factors(norm_upper_bound(sq, **f32)) for m in maps])
        assert torch.equal(scales[:, [0, 2]], unmasked[:, [0, 2]])
        assert scales[0, 0].item() == pytest.approx(0.5, rel=1e-6) and scales[0, 0].item() < 0.5  # AbadiClip(1)
        assert scales[0, 2].item() == 1.0

    scales, finite = _chunk_scales(
        torch.tensor([4.0, 0.25], dtype=torch.float64), maps[:1], dtype=torch.float64, terms=4
    )
    assert finite is None and scales.shape == (1, 2) and scales.dtype == torch.float64


def test_all_rows_non_finite_gives_zeros() -> None:
    model, X, y, loss = _zoo(ZOO[2], torch.float64, n=3)
    X = torch.full_like(X, float("nan"))
    for mode in MODES:
        got = ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=2, pass2=mode
        )
        for name, p in trainable_parameters(model).items():
            assert torch.equal(got[name], torch.zeros_like(p))


def test_works_when_the_caller_disabled_gradients() -> None:
    model, X, y, loss = _zoo(ZOO[4], torch.float64, n=5)
    clip = AbadiClip(0.1)
    expected = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=2)
    for mode in MODES:
        with torch.no_grad():
            got = ghost_clipped_grad_sum(
                model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=2, pass2=mode
            )
        _assert_sums_close(got, expected, 1e-10)


def test_empty_batch_gives_zeros_and_empty_norms() -> None:
    model, X, y, loss = _zoo(ZOO[4], torch.float32)
    for mode in MODES:
        got = ghost_clipped_grad_sum(
            model, X[:0], y[:0], loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4, pass2=mode
        )
        for name, p in trainable_parameters(model).items():
            assert torch.equal(got[name], torch.zeros_like(p))
    assert ghost_per_sample_norms(model, X[:0], y[:0], loss=loss, max_physical_batch_size=4).shape == (0,)


def test_clipped_rows_have_norm_exactly_the_bound() -> None:
    """Guards the joint (flat) norm: per-layer norms would leave the total above C."""
    model, X, y, loss = _zoo(ZOO[2], torch.float64, n=1)
    norm = float(ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=1)[0])
    total = ghost_clipped_grad_sum(
        model, X, y, loss=loss, per_sample_map=AbadiClip(norm / 3), max_physical_batch_size=1
    )
    flat = sum(float(t.pow(2).sum()) for t in total.values()) ** 0.5
    assert flat == pytest.approx(norm / 3, rel=1e-12)


# ----------------------------------------------------------------------------- other layers


def _with_data(
    model: nn.Module,
    input_shape: tuple[int, ...],
    n_outputs: int,
    *,
    n: int = 7,
    vocab: int | None = None,
    seed: int = 0,
) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    gen = torch.Generator().manual_seed(seed)
    model = model.double()
    if vocab is not None:
        X = torch.randint(0, vocab, (n, *input_shape), generator=gen)
    else:
        X = torch.randn(n, *input_shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, n_outputs, (n,), generator=gen)
    return model, X, y, "cross_entropy"


def _seeded(builder):  # noqa: ANN001, ANN202 - reproducible init for the ad-hoc models below
    torch.manual_seed(0)
    return builder()


LAYER_CASES = {
    "linear-sequence": (
        lambda: nn.Sequential(
            nn.Linear(4, 5), nn.GELU(), nn.LayerNorm(5), nn.Linear(5, 3), nn.Flatten(), nn.Linear(18, 3)
        ),
        (6, 4),
        3,
        None,
    ),
    "layernorm-2d-shape": (
        lambda: nn.Sequential(nn.LayerNorm((3, 4)), nn.Flatten(), nn.Linear(12, 2)),
        (3, 4),
        2,
        None,
    ),
    "conv1d-groups-circular": (
        lambda: nn.Sequential(
            nn.Conv1d(4, 6, 3, stride=2, padding=2, groups=2, padding_mode="circular"),
            nn.SiLU(),
            nn.AvgPool1d(2),
            nn.Flatten(),
            nn.Linear(24, 3),
        ),
        (4, 15),
        3,
        None,
    ),
    "conv1d-same-dilated": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 3, 3, padding="same", dilation=2),
            nn.ELU(),
            nn.AdaptiveAvgPool1d(2),
            nn.Flatten(),
            nn.Linear(6, 2),
        ),
        (2, 9),
        2,
        None,
    ),
    "conv2d-groups-dilation-reflect": (
        lambda: nn.Sequential(
            nn.Conv2d(4, 6, 3, stride=(2, 1), padding=1, dilation=(1, 2), groups=2, padding_mode="reflect"),
            nn.GroupNorm(3, 6),
            nn.LeakyReLU(),
            nn.AdaptiveAvgPool2d((2, 2)),
            nn.Flatten(),
            nn.Linear(24, 3),
        ),
        (4, 9, 8),
        3,
        None,
    ),
    "conv2d-same-no-bias": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, (3, 2), padding="same", bias=False),
            nn.Sigmoid(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(36, 2),
        ),
        (3, 6, 6),
        2,
        None,
    ),
    "embedding-padding-idx": (
        lambda: nn.Sequential(
            nn.Embedding(6, 3, padding_idx=0), nn.Linear(3, 4), nn.Tanh(), nn.Flatten(), nn.Linear(20, 3)
        ),
        (5,),
        3,
        6,
    ),
    "embedding-large-vocab": (
        lambda: nn.Sequential(nn.Embedding(500, 4), nn.LayerNorm(4), nn.Flatten(), nn.Linear(12, 2)),
        (3,),
        2,
        500,
    ),
}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("gram", [None, True, False], ids=["auto", "gram", "materialise"])
@pytest.mark.parametrize("case", LAYER_CASES)
def test_other_layers_match_vmap_engine(case: str, gram: bool | None) -> None:
    builder, input_shape, n_outputs, vocab = LAYER_CASES[case]
    model, X, y, loss = _with_data(_seeded(builder), input_shape, n_outputs, vocab=vocab)
    with _force(gram=gram):
        _check_against_vmap(model, X, y, loss, chunks=(3,), modes=MODES if gram is None else ("bk",))


@settings(max_examples=60, deadline=None)
@given(
    dims=st.sampled_from([1, 2]),
    groups=st.sampled_from([1, 2]),
    per_group=st.integers(1, 3),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 2),
    padding=st.integers(0, 2),
    padding_mode=st.sampled_from(["zeros", "reflect", "circular"]),
    size=st.integers(6, 11),
)
def test_window_patches_equal_unfold_patches(
    dims: int,
    groups: int,
    per_group: int,
    kernel: int,
    stride: int,
    dilation: int,
    padding: int,
    padding_mode: str,
    size: int,
) -> None:
    """The patch matrix (a copied strided window) is F.unfold's, value for value."""
    assume(dilation * (kernel - 1) + 1 <= size + 2 * padding)  # the output has at least one position
    assume(padding_mode != "reflect" or padding < size)
    conv_type = nn.Conv1d if dims == 1 else nn.Conv2d
    conv = conv_type(
        groups * per_group, groups, kernel, stride=stride, dilation=dilation, padding=padding,
        groups=groups, padding_mode=padding_mode,
    )  # fmt: skip
    a = torch.randn(3, groups * per_group, *([size] * dims), dtype=torch.float64)
    d = conv.double()(a)
    padded = a if padding_mode == "zeros" else F.pad(a, conv._reversed_padding_repeated_twice, mode=padding_mode)
    unfold_padding = padding if padding_mode == "zeros" else 0
    if dims == 1:
        by_unfold = F.unfold(
            padded.unsqueeze(2), (1, kernel), dilation=(1, dilation), padding=(0, unfold_padding), stride=(1, stride)
        )
    else:
        by_unfold = F.unfold(padded, kernel, dilation=dilation, padding=unfold_padding, stride=stride)
    by_window = linear_conv._conv_patches(conv, a, d.shape[2:])
    assert by_window.shape == by_unfold.shape
    assert torch.equal(by_window, by_unfold)


def test_reused_layer_and_frozen_parameters() -> None:
    torch.manual_seed(0)
    shared = nn.Linear(5, 5)
    conv = nn.Conv1d(1, 2, 3)
    model = nn.Sequential(
        nn.Unflatten(1, (1, 5)),
        conv,
        nn.Flatten(),
        nn.Tanh(),
        nn.Linear(6, 5),
        shared,
        nn.Tanh(),
        shared,
        nn.ReLU(),
        nn.Linear(5, 3),
    )
    model, X, y, loss = _with_data(model, (5,), 3)
    for gram in (None, True, False):
        with _force(gram=gram):
            _check_against_vmap(model, X, y, loss, chunks=(4,))
    conv.weight.requires_grad_(False)  # bias only
    model[4].bias.requires_grad_(False)  # weight only
    assert "1.weight" not in trainable_parameters(model)
    _check_against_vmap(model, X, y, loss, chunks=(4,))


def test_sequence_linear_rule_is_chosen_by_shape() -> None:
    with mock.patch.dict(linear_conv.WRITE_COST_FLOPS, {"flops-only": 0}):
        # Few positions, wide layer: Gram is cheaper for the norm; many positions, narrow: materialise.
        assert linear_conv._use_gram(64, 1, 4, 512, 512, bk=False, device_type="flops-only")
        assert not linear_conv._use_gram(64, 1, 512, 8, 8, bk=False, device_type="flops-only")
        # Book-keeping adds the weighted sum: materialised gradients make it a cheap tensordot.
        assert not linear_conv._use_gram(64, 1, 64, 2304, 256, bk=True, device_type="flops-only")
        # Materialising (B × |W|) is capped: beyond the cap the Gram form is used.
        assert linear_conv._use_gram(4096, 1, 16, 4096, 4096, bk=True, device_type="flops-only")
    # On a CPU (and a GPU) each value materialising writes costs 128 flops (whole steps timed by
    # bench/gram_choice.py --whole-steps): a wrn 16-4 layer on 8×8 positions (o·k = 590k values per
    # row against 2·T² = 8k) and the ViT's layers (T = 65, 192 × 192) take the Gram form; a layer
    # on many positions with few weights (wrn 16-4's first group, T = 1024) stays materialised.
    assert linear_conv.WRITE_COST_FLOPS["cpu"] == 128
    assert linear_conv._use_gram(64, 1, 64, 2304, 256, bk=True, device_type="cpu")
    assert linear_conv._use_gram(64, 1, 65, 192, 192, bk=True, device_type="cpu")
    assert not linear_conv._use_gram(64, 1, 1024, 576, 64, bk=True, device_type="cpu")
    with mock.patch.dict(linear_conv.WRITE_COST_FLOPS, {"cpu": 32}):
        assert not linear_conv._use_gram(64, 1, 65, 192, 192, bk=True, device_type="cpu")
    # A device type without a measured write cost compares flops alone.
    assert not linear_conv._use_gram(64, 1, 64, 2304, 256, bk=True, device_type="no-such-device")


@settings(max_examples=60, deadline=None)
@given(
    widths=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    d_in=st.integers(1, 6),
    positions=st.one_of(st.none(), st.integers(1, 4)),
    n_outputs=st.integers(1, 4),
    activation=st.sampled_from([nn.Tanh, nn.ReLU, nn.Identity]),
    bias=st.booleans(),
    n=st.integers(0, 9),
    chunk=st.integers(1, 5),
    mse=st.booleans(),
    gram=st.sampled_from([None, True, False]),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**16),
)
def test_random_linear_stacks_match_vmap_engine(
    widths: list[int],
    d_in: int,
    positions: int | None,
    n_outputs: int,
    activation: type,
    bias: bool,
    n: int,
    chunk: int,
    mse: bool,
    gram: bool | None,
    mode: str,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = d_in
    for w in widths:
        layers += [nn.Linear(width, w, bias=bias), activation()]
        width = w
    if positions is not None:  # Linear layers see (B, T, d); flatten before the head
        layers.append(nn.Flatten())
        width *= positions
    outputs = 1 if mse else n_outputs
    layers.append(nn.Linear(width, outputs))
    model = nn.Sequential(*layers).double()
    shape = (n, d_in) if positions is None else (n, positions, d_in)
    X = torch.randn(*shape, dtype=torch.float64) * 3
    y = torch.randn(n, dtype=torch.float64) if mse else torch.randint(0, outputs, (n,))
    loss = "mse" if mse else "cross_entropy"
    clip = AbadiClip(0.5)
    reference = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    with _force(gram=gram):
        got = ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=chunk, pass2=mode
        )  # type: ignore[arg-type]
        norms = ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=chunk)
    # Dead ReLUs and a one-output softmax can make every gradient zero but for rounding (one
    # found: a bias sum of −5.6e-17 against an exact 0): rounding next to the sum's bound n·C.
    _assert_sums_close(got, reference, 1e-10, atol=1e-12 * 0.5 * n)
    if n:
        torch.testing.assert_close(norms, _vmap_norms(model, X, y, loss), rtol=1e-10, atol=1e-13)


# ----------------------------------------------------------------------------- refusals


class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.fc.weight)  # bypasses the layer: must be refused


def _tied() -> nn.Module:
    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    b.weight = a.weight
    return nn.Sequential(a, nn.Tanh(), b)


class _OwnParam(nn.Sequential):
    pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)), r"module 1 is BatchNorm1d"),
        (lambda: nn.Sequential(nn.Linear(3, 3), nn.Dropout()), r"module 1 \(Dropout\) has p=0.5"),
        (lambda: nn.Sequential(nn.Flatten(0), nn.Linear(3, 3)), r"module 0 \(Flatten\)"),
        (lambda: nn.Sequential(nn.Unflatten(-2, (1, 3)), nn.Flatten(), nn.Linear(3, 3)), r"module 0 \(Unflatten\)"),
        (lambda: nn.Sequential(nn.Embedding(5, 3, max_norm=1.0)), r"module 0 \(Embedding\)"),
        (lambda: nn.Sequential(nn.Embedding(5, 3, scale_grad_by_freq=True)), r"module 0 \(Embedding\)"),
        (_Custom, r"module <root> of type _Custom"),
        (_tied, r"tied parameters"),
        (lambda: nn.Sequential(nn.Conv3d(1, 1, 1)), r"module 0 of type Conv3d"),
    ],
)
def test_unsupported_models_are_refused_with_the_layer_named(make, message: str) -> None:  # noqa: ANN001
    model = make()
    assert not supports(model)
    with pytest.raises(ValueError, match=message):
        check_ghost_supported(model)
    X, y = torch.randn(4, 3), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=4
        )


@pytest.mark.parametrize(("compiled", "where"), [("", r"<root> \(Sequential\)"), ("2", r"2 \(Linear\)")])
def test_a_compiled_model_is_refused_and_the_vmap_engine_takes_it(compiled: str, where: str) -> None:
    """A compiled forward runs without the engine's hooks: under compile it recorded nothing and
    returned a zero sum. Refused, so the training loop's engine choice falls back to the vmap
    engine, which is exact for it (compared against the same model uncompiled)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    uncompiled = copy.deepcopy(model)
    model.get_submodule(compiled).compile()  # lazy: nothing is compiled before a call
    assert supports(uncompiled)
    assert not supports(model)
    with pytest.raises(ValueError, match=rf"module {where} is compiled with torch.compile"):
        check_ghost_supported(model)
    X, y = torch.randn(4, 3), torch.randint(0, 2, (4,))
    with pytest.raises(ValueError, match=r"is compiled with torch.compile"):
        ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=4
        )
    aggregator = per_sample_map_aggregator(model, AbadiClip(1.0))
    assert isinstance(aggregator, PerSampleMapAggregator)
    got = aggregator.clipped_sum(
        model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=4, generator=SecureRandom.from_seed(0)
    )
    want = clipped_grad_sum(
        uncompiled, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=4
    )
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name])
        assert want[name].abs().sum() > 0


def test_container_owning_a_parameter_is_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 3))
    model.register_parameter("scale", nn.Parameter(torch.ones(3)))
    with pytest.raises(ValueError, match=r"parameter 'scale' of module <root>"):
        check_ghost_supported(model)


def test_an_inplace_activation_after_a_recorded_layer_is_exact() -> None:
    """The tap sits between the layer and the inplace ReLU in the graph, so the gradient it hands
    over is the one w.r.t. the layer's own output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    X, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    _check_against_vmap(model, X, y, "cross_entropy", chunks=(6, 4))


class _ModifiesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        x.mul_(2.0)  # after the layer has read it
        return out


def test_a_recorded_input_modified_in_place_is_refused_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(support, "GHOST_CONTAINERS", {*support.GHOST_CONTAINERS, _ModifiesItsInput})
    model = _ModifiesItsInput()
    assert supports(model)  # only visible when it runs
    with pytest.raises(ValueError, match=r"input of module inner \(Linear\) is modified in place"):
        ghost_clipped_grad_sum(
            model,
            torch.randn(4, 3),
            torch.zeros(4, dtype=torch.int64),
            loss="cross_entropy",
            per_sample_map=AbadiClip(1.0),
            max_physical_batch_size=4,
        )
    for m in model.modules():
        assert not m._forward_hooks


def test_registered_container_is_accepted() -> None:
    with mock.patch.object(support, "GHOST_CONTAINERS", set(support.GHOST_CONTAINERS)):
        assert not supports(_OwnParam(nn.Linear(2, 2)))
        support.ghost_container(_OwnParam)
        assert supports(_OwnParam(nn.Linear(2, 2)))
    assert not supports(_OwnParam(nn.Linear(2, 2)))


def test_bad_arguments() -> None:
    model, X, y, loss = _zoo(ZOO[0], torch.float64)
    with pytest.raises(ValueError, match="max_physical_batch_size"):
        ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=0)
    with pytest.raises(ValueError, match="rows"):
        ghost_clipped_grad_sum(model, X, y[:-1], loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4)
    with pytest.raises(ValueError, match="pass2"):
        ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4, pass2="twice"
        )  # type: ignore[arg-type]
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4)


# ----------------------------------------------------------------------------- the aggregator


def test_aggregator_matches_per_sample_map_aggregator_and_trains_identically() -> None:
    clip = AbadiClip(0.7)
    ghost_agg, vmap_agg = GhostClipAggregator(clip), PerSampleMapAggregator(clip)
    assert ghost_agg.sensitivity == vmap_agg.sensitivity == 0.7
    model, X, y, loss = _zoo(ZOO[4], torch.float64, n=12)
    gen = SecureRandom.from_seed(0)
    kwargs = dict(step=0, loss=loss, max_physical_batch_size=5, generator=gen)
    _assert_sums_close(ghost_agg.clipped_sum(model, X, y, **kwargs), vmap_agg.clipped_sum(model, X, y, **kwargs), 1e-10)

    config = DPSGDConfig(
        steps=3,
        sampling_probability=0.5,
        noise_multiplier=1.0,
        clipping_norm=0.7,
        learning_rate=0.1,
        momentum=0.9,
        max_physical_batch_size=4,
    )
    trained = []
    for aggregator in (None, ghost_agg):
        m, _, _, _ = _zoo(ZOO[4], torch.float64, n=12)
        train_dp_sgd(m, X, y, config=config, generator=SecureRandom.from_seed(5), aggregator=aggregator)
        trained.append(m.state_dict())
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-9, atol=1e-12)


def test_conv_sums_on_cuda_run_cudnn_in_ieee_float32_and_restore_its_setting() -> None:
    """cuDNN's TF32 default would round the Gram form's conv sums to a 10-bit mantissa."""
    cudnn = torch.backends.cudnn
    saved = cudnn.allow_tf32
    cuda_float32 = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)  # no GPU needed
    try:
        cudnn.allow_tf32 = True
        with linear_conv._ieee_float32_convolutions(cuda_float32):
            assert not cudnn.allow_tf32 and cudnn.conv.fp32_precision != "tf32"
        assert cudnn.allow_tf32 and cudnn.conv.fp32_precision == "tf32"
        with pytest.raises(RuntimeError), linear_conv._ieee_float32_convolutions(cuda_float32):
            raise RuntimeError("a failing kernel")
        assert cudnn.allow_tf32
        for other in (torch.zeros(1), torch.zeros(1, dtype=torch.float64)):  # CPU, or not float32: untouched
            with linear_conv._ieee_float32_convolutions(other):
                assert cudnn.allow_tf32
        cudnn.allow_tf32 = False  # already IEEE: left as it is
        with linear_conv._ieee_float32_convolutions(cuda_float32):
            assert not cudnn.allow_tf32
        assert not cudnn.allow_tf32
    finally:
        cudnn.allow_tf32 = saved


def test_materialised_conv_gradients_on_cuda_follow_the_convolutions_tf32_setting() -> None:
    """Built by GEMMs, they take cuDNN's TF32 setting (the model's own convolutions' precision)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = cudnn.allow_tf32, matmul.allow_tf32
    cuda_float32 = SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32)  # no GPU needed
    try:
        cudnn.allow_tf32, matmul.allow_tf32 = True, False
        with linear_conv._matmuls_as_precise_as_convolutions(cuda_float32):
            assert matmul.allow_tf32
        assert not matmul.allow_tf32
        with pytest.raises(RuntimeError), linear_conv._matmuls_as_precise_as_convolutions(cuda_float32):
            raise RuntimeError("a failing kernel")
        assert not matmul.allow_tf32
        cudnn.allow_tf32 = False  # the process wants full float32 convolutions: so are these GEMMs
        with linear_conv._matmuls_as_precise_as_convolutions(cuda_float32):
            assert not matmul.allow_tf32
        cudnn.allow_tf32 = True
        for other in (torch.zeros(1), torch.zeros(1, dtype=torch.float64)):  # CPU, or not float32: untouched
            with linear_conv._matmuls_as_precise_as_convolutions(other):
                assert not matmul.allow_tf32
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu() -> None:  # pragma: no cover - runs on GPU workers only
    model, X, y, loss = _zoo(ZOO[5], torch.float64, n=20)
    clip = AbadiClip(1.0)
    expected = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=8)
    model = model.float().cuda()
    X = X.float()  # rows stay on the CPU: each chunk is moved to the model's device
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for mode in MODES:
            got = ghost_clipped_grad_sum(
                model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=8, pass2=mode
            )
            assert all(t.device.type == "cuda" for t in got.values())
            _assert_sums_close({k: v.cpu().double() for k, v in got.items()}, expected, 1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


class _DeadBranch(nn.Module):
    """One layer's output never reaches the loss: its call is recorded, autograd gives it no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.dead = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dead(x)
        out: torch.Tensor = self.used(x)
        return out


@pytest.mark.parametrize("pass2", ["bk", "retain", "recompute"])
def test_a_layer_whose_output_does_not_reach_the_loss_adds_nothing(monkeypatch: pytest.MonkeyPatch, pass2: str) -> None:
    monkeypatch.setattr(support, "GHOST_CONTAINERS", {*support.GHOST_CONTAINERS, _DeadBranch})
    torch.manual_seed(0)
    model = _DeadBranch()
    X, y = torch.randn(7, 4), torch.randint(0, 3, (7,))
    got = ghost_clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(0.3), max_physical_batch_size=4, pass2=pass2
    )
    alone = ghost_clipped_grad_sum(
        model.used, X, y, loss="cross_entropy", per_sample_map=AbadiClip(0.3), max_physical_batch_size=4
    )
    assert torch.equal(got["dead.weight"], torch.zeros(2, 4)) and torch.equal(got["dead.bias"], torch.zeros(2))
    torch.testing.assert_close(got["used.weight"], alone["weight"])
    torch.testing.assert_close(got["used.bias"], alone["bias"])


def test_outputs_autograd_does_not_keep_are_freed_before_the_backward() -> None:
    """The recorder keeps no layer output past the forward's version check: a residual branch's
    last Linear (its output only feeds an addition, which saves nothing) is freed before the
    backward instead of held to its end; its gradient still reaches the inbox through the tap."""
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 11, "pad_id": 0}
    model = build_model("transformer-lm", params, input_shape=(6,), n_outputs=11)
    x = torch.randint(1, 11, (3, 6))
    seen: list[weakref.ref[torch.Tensor]] = []
    arrived: dict[int, torch.Tensor] = {}
    with Recorder(model) as recorder:
        # registered after the recorder's hook: sees the tapped output the rest of the model uses
        model.blocks[0].attention.out.register_forward_hook(lambda _m, _a, out: seen.append(weakref.ref(out)))
        recorder.start(3)
        logits = model(x)
        recorder.stop()
        recorder.check_versions()
        out_layer = [index for index, layer in enumerate(recorder.layers) if layer.where == "blocks.0.attention.out"]
        (call,) = [index for index, call in enumerate(recorder.calls) if call.layer_index == out_layer[0]]
        gc.collect()
        assert len(seen) == 1 and seen[0]() is None
        assert recorder.anchor is not None
        recorder.inbox.open(lambda index, delta: arrived.__setitem__(index, delta))
        torch.autograd.grad(logits.square().sum(), [recorder.anchor], allow_unused=True)
        recorder.inbox.close()
        n_calls = len(recorder.calls)
    assert sorted(arrived) == list(range(n_calls))
    assert arrived[call].shape == (3, 6, 8) and bool(arrived[call].abs().sum() > 0)


def test_each_layer_work_is_built_during_the_backward_and_lets_go_of_its_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A layer's work is built when its output gradient arrives, inside the backward, last layer
    first, and the engine then holds that layer's recorded input no longer: what a work does not
    keep (a norm layer's input and output gradient) is freed while the backward goes on."""
    model = nn.Sequential(nn.Linear(4, 8), nn.GroupNorm(2, 8), nn.Tanh(), nn.Linear(8, 3))
    X, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    inside = [False]
    real_grad = torch.autograd.grad

    def grad(*args: object, **kwargs: object) -> object:
        inside[0] = True
        try:
            return real_grad(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            inside[0] = False

    builds: list[tuple[int, bool, int]] = []
    real_build = ghost_engine._LayerWorks._build

    def build(self: ghost_engine._LayerWorks, layer_index: int) -> None:
        real_build(self, layer_index)
        builds.append((layer_index, inside[0], len(self._calls)))

    monkeypatch.setattr(torch.autograd, "grad", grad)
    monkeypatch.setattr(ghost_engine._LayerWorks, "_build", build)
    got = ghost_clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(0.5), max_physical_batch_size=5
    )
    assert builds == [(2, True, 2), (1, True, 1), (0, True, 0)]
    monkeypatch.undo()
    reference = clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(0.5), max_physical_batch_size=5
    )
    _assert_sums_close(got, reference, 1e-5)


def _kept_tensors(work: LayerWork) -> list[torch.Tensor]:
    """Every tensor a layer's work holds through its closures (what it keeps until the scales are
    known); modules are skipped (their parameters are not the chunk's)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack: list[object] = [work.accumulate, work.per_sample]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, nn.Module):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found[id(obj)] = obj
        elif isinstance(obj, types.FunctionType):
            stack.extend(cell.cell_contents for cell in obj.__closure__ or () if _cell_filled(cell))
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, linear_conv.RowBlocks):
            stack.append(obj.take)
    return list(found.values())


def _cell_filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("gram", [False, True], ids=["materialised", "gram"])
def test_a_conv_work_keeps_only_what_its_form_needs(gram: bool) -> None:
    """With materialised gradients the layer's work holds G, not the output gradients δ (both are
    chunk-sized: holding δ too would add to the chunk's peak memory); the Gram form needs δ and
    keeps it, with the raw input rather than its patches. Either way its per-sample gradients are
    the layer's."""
    conv = nn.Conv2d(2, 3, 3, padding=1).double()
    a = torch.randn(4, 2, 5, 5, dtype=torch.float64)
    d = torch.randn(4, 3, 5, 5, dtype=torch.float64)
    expected = torch.stack(
        [torch.nn.grad.conv2d_weight(a[i : i + 1], conv.weight.shape, d[i : i + 1], padding=1) for i in range(4)]
    )
    delta = weakref.ref(d)
    with _force(gram=gram):
        work = linear_conv.conv_work(conv, {"weight": "w", "bias": "b"}, [(a, d)], bk=True)
    # never the input patches (9× the input here): the Gram form rebuilds them block by block
    assert max(t.numel() for t in _kept_tensors(work)) <= d.numel()
    del d
    gc.collect()
    assert (delta() is not None) == gram
    grads = work.per_sample()
    torch.testing.assert_close(grads["w"], expected, rtol=1e-12, atol=1e-12)
    assert grads["b"].shape == (4, 3)


@pytest.mark.parametrize("block", [1, 150, 10**9], ids=["element", "few-rows", "whole-chunk"])
def test_conv_gradients_built_in_row_blocks_are_the_same(block: int) -> None:
    """The patch matrix is built a bounded number of values at a time (rows in blocks): the
    per-sample gradients, norms and sums are bit for bit those of one block, and the vmap engine's."""
    builder, input_shape, n_outputs, vocab = LAYER_CASES["conv2d-groups-dilation-reflect"]
    model, X, y, loss = _with_data(_seeded(builder), input_shape, n_outputs, vocab=vocab)
    with _force(gram=False):
        whole = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=AbadiClip(0.1), max_physical_batch_size=7)
        with mock.patch.object(linear_conv, "PATCH_BLOCK_ELEMENTS", block):
            blocked = ghost_clipped_grad_sum(
                model, X, y, loss=loss, per_sample_map=AbadiClip(0.1), max_physical_batch_size=7
            )
            _check_against_vmap(model, X, y, loss, chunks=(7,), modes=("bk",))
    assert all(torch.equal(blocked[name], whole[name]) for name in whole)


@pytest.mark.parametrize("block", [1, 150], ids=["one-row", "few-rows"])
def test_gram_conv_patches_rebuilt_in_row_blocks_give_the_same_results(block: int) -> None:
    """The Gram form rebuilds a conv layer's patches a block of rows at a time for its norms, its
    weighted sum and its per-sample gradients: the same values as one block, and the vmap engine's."""
    builder, input_shape, n_outputs, vocab = LAYER_CASES["conv2d-groups-dilation-reflect"]
    model, X, y, loss = _with_data(_seeded(builder), input_shape, n_outputs, vocab=vocab)
    with _force(gram=True):
        whole = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=AbadiClip(0.1), max_physical_batch_size=7)
        whole_norms = ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=7)
        with mock.patch.object(linear_conv, "PATCH_BLOCK_ELEMENTS", block):
            blocked = ghost_clipped_grad_sum(
                model, X, y, loss=loss, per_sample_map=AbadiClip(0.1), max_physical_batch_size=7
            )
            blocked_norms = ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=7)
            _check_against_vmap(model, X, y, loss, chunks=(7,), modes=("bk",))
    torch.testing.assert_close(blocked_norms, whole_norms, rtol=1e-12, atol=0.0)
    _assert_sums_close(blocked, whole, 1e-12)


def test_an_embedding_takes_the_form_that_costs_less_with_its_writes() -> None:
    """At T = 64 over a 1,024-token vocabulary of width 256 materialising writes 262k values per
    row against the Gram form's 4k: with the CPU's write cost the Gram form is taken (it keeps
    the output gradients only), by flops alone the (B, V, d) gradients; both are exact."""
    torch.manual_seed(0)
    embedding = nn.Embedding(1024, 256)
    idx, d = torch.randint(0, 1024, (2, 64)), torch.randn(2, 64, 256)
    gram = embedding_rules.embedding_work(embedding, {"weight": "w"}, [(idx, d)], bk=True)
    assert max(t.numel() for t in _kept_tensors(gram)) < 2 * 1024 * 256
    with mock.patch.dict(linear_conv.WRITE_COST_FLOPS, {"cpu": 0}):
        materialised = embedding_rules.embedding_work(embedding, {"weight": "w"}, [(idx, d)], bk=True)
    assert max(t.numel() for t in _kept_tensors(materialised)) == 2 * 1024 * 256
    torch.testing.assert_close(gram.sq_norms, materialised.sq_norms, rtol=1e-5, atol=0.0)
    torch.testing.assert_close(gram.per_sample()["w"], materialised.per_sample()["w"])


def test_per_sample_gradients_leave_the_callers_grad_mode_alone() -> None:
    """The iterator's own no-grad region ends before each yield, so the caller's loop body runs in
    the caller's grad mode (and the model is unhooked between chunks)."""
    model, X, y, loss = _zoo(ZOO[4], torch.float32, n=6)
    seen = []
    for grads in iter_ghost_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=4):
        seen.append((torch.is_grad_enabled(), next(iter(grads.values())).shape[0]))
        assert not any(m._forward_hooks for m in model.modules())
    with torch.no_grad():
        for _ in iter_ghost_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=4):
            seen.append((torch.is_grad_enabled(), 0))
    assert seen == [(True, 4), (True, 2), (False, 0), (False, 0)]
