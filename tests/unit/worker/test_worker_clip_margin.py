"""Clipping holds in floating point (issue 35, item 7; dp/per_example/clip_margin.py): every
clipped per-sample vector, as the engines compute it in float32, has norm ≤ C, for adversarial
gradients, large dimensions, every per-sample map, and the ghost engine's forms (Gram and
materialised, weight-standardised convolutions, embeddings). The naive float32 clip the engines
used before exceeds C on the same rows, which is what makes these tests fail on the old code.

"Exact" norms here are the float64 sums of the float64 squares of the float32 values (each square
exact, numpy's pairwise sum: relative error ~1e-15), far below the 1.1e-7·C the proof leaves."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dp.per_example.clip_margin import clip_target, norm_upper_bound
from dp.per_example.ghost import api as ghost_api
from dp.per_example.ghost import ghost_clipped_grad_sum, ghost_per_sample_norms, linear_conv
from dp.per_example.per_sample import AbadiClip, PerSampleMap, clipped_grad_sum, per_sample_norms
from dp.per_example.per_sample_maps import AutoSClip, PSACClip
from privtrain_common.zoo.architectures import build_model

PROVEN = 1.0 - 1e-7
"""The proof leaves every realised norm below C·(1 − 1.9·2⁻²⁴) ≈ C·(1 − 1.1e-7)."""


def _exact_norm(tensors: list[torch.Tensor]) -> float:
    return float(np.sqrt(sum(float(np.sum(t.detach().double().numpy().ravel() ** 2)) for t in tensors)))


def _adversarial_rows(seed: int) -> list[dict[str, torch.Tensor]]:
    """Per-sample gradients of one row each, over three tensors: Gaussian, all-positive and
    near-constant values (whose float32 sums of squares round worst), at scales 1e-3 … 1e3, up to
    2²² + 2¹⁶ values per row."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for size in (1_000, 100_000, 1 << 22):
        for kind in ("gauss", "abs", "flat"):
            scale = float(10 ** (torch.rand(1, generator=gen) * 6 - 3))
            parts = [torch.randn(1, n, generator=gen) for n in (size, 1 << 16, 37)]
            if kind == "abs":
                parts = [p.abs() for p in parts]
            if kind == "flat":
                parts = [1.0 + 1e-3 * p.abs() + float(torch.rand(1, generator=gen)) for p in parts]
            rows.append({f"p{i}": (p * scale).float() for i, p in enumerate(parts)})
    return rows


def _realised(grads: dict[str, torch.Tensor], scale: torch.Tensor) -> list[torch.Tensor]:
    """What the engine adds for the row: each coordinate of scale·g rounded to float32 once."""
    return [g * scale.view(-1, *[1] * (g.dim() - 1)) for g in grads.values()]


MAPS = [
    pytest.param(lambda c: AbadiClip(c), id="abadi"),
    pytest.param(lambda c: AutoSClip(c, gamma=1e-6), id="auto-s"),
    pytest.param(lambda c: PSACClip(c, r=1e-6), id="psac"),
]


@pytest.mark.parametrize("make_map", MAPS)
def test_adversarial_rows_stay_within_the_bound(make_map: object) -> None:
    naive_over = 0
    for grads in _adversarial_rows(seed=1):
        exact = _exact_norm(list(grads.values()))
        for fraction in (0.5, 1.0 - 1e-7, 1.0, 1.0 + 1e-7, 1.0 + 3e-7):  # around the row's own norm
            clip = fraction * exact
            per_sample_map: PerSampleMap = make_map(clip)  # type: ignore[operator]
            norms = per_sample_norms(grads)
            assert float(norms) >= exact  # an upper bound, never below the exact norm
            realised = _exact_norm(_realised(grads, per_sample_map.scale_factors(norms)))
            assert realised <= clip * PROVEN, (fraction, realised / clip)
            # The float32 clip used before: C/‖g‖ from a float32 norm.
            old = torch.stack([g.reshape(1, -1).pow(2).sum(dim=1) for g in grads.values()]).sum(dim=0).sqrt()
            old_scale = torch.where(old > clip, clip / old, torch.ones_like(old))
            naive_over += _exact_norm(_realised(grads, old_scale)) > clip
    assert naive_over > 0  # the old clip exceeded C on some of these rows


@settings(max_examples=150, deadline=None)
@given(
    values=arrays(
        np.float32,
        st.integers(min_value=1, max_value=3000),
        elements=st.floats(min_value=-(2.0**40), max_value=2.0**40, allow_nan=False, width=32),
    ),
    fraction=st.floats(min_value=1e-6, max_value=2.0),
)
def test_any_float32_row_is_clipped_within_the_bound(values: np.ndarray, fraction: float) -> None:
    g = torch.from_numpy(values).reshape(1, -1)
    exact = _exact_norm([g])
    if exact == 0.0 or not np.isfinite(exact):
        return
    norm = per_sample_norms({"w": g})
    assert float(norm) >= exact
    clip = max(fraction * exact, 1e-6)
    realised = _exact_norm(_realised({"w": g}, AbadiClip(clip).scale_factors(norm)))
    assert realised <= clip * PROVEN


def test_the_charged_sensitivity_is_unchanged_and_small_rows_are_untouched() -> None:
    """The charge's S is still C (golden charges unchanged); rows within the target keep scale 1."""
    assert AbadiClip(1.5).norm_bound == AutoSClip(1.5).norm_bound == PSACClip(1.5).norm_bound == 1.5
    assert clip_target(1.0, torch.float32) == 1.0 - 2.0**-21
    norms = torch.tensor([0.5, clip_target(1.0, torch.float32), 1.0], dtype=torch.float32)
    assert AbadiClip(1.0).scale_factors(norms)[:2].tolist() == [1.0, 1.0]


def test_the_norm_is_an_upper_bound_in_the_gradients_dtype() -> None:
    squares = torch.tensor([1.0 + 2.0**-40, 4.0, float("inf"), 1e300, 0.0], dtype=torch.float64)
    norms = norm_upper_bound(squares, terms=10, dtype=torch.float32)
    assert norms.dtype == torch.float32
    assert norms[0].item() > 1.0 and 2.0 < norms[1].item() < 2.0 * (1 + 2.0**-22)
    assert norms[2].item() == float("inf") and norms[3].item() == float("inf") and norms[4].item() == 0.0
    exact = norm_upper_bound(torch.tensor([4.0], dtype=torch.float64), terms=10, dtype=torch.float64)
    assert 2.0 < exact.item() < 2.0 * (1 + 1e-14)  # float64 gradients: a float64-sized margin
    with pytest.raises(ValueError, match="proven range"):
        norm_upper_bound(torch.tensor([4.0], dtype=torch.float64), terms=2**32, dtype=torch.float32)


# ---------------------------------------------------------------------------------- ghost engine

IMAGE_MODELS = [
    ("wrn-ws", "wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, (3, 8, 8), 3),
    ("cnn", "cnn", {"channels": [4, 8], "groups": 2, "activation": "tanh", "pooling": "avg"}, (3, 8, 8), 3),
    ("vit", "vit", {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12}, (3, 8, 8), 3),
    ("mlp", "mlp", {"hidden_sizes": [64, 32]}, (300,), 4),
]


def _model(case: tuple, n: int) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    _, name, params, input_shape, n_outputs = case
    gen = torch.Generator().manual_seed(11)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen)
    # Large inputs and rows of very different sizes: every row is clipped, some far beyond C.
    X = torch.randn(n, *input_shape, generator=gen) * torch.logspace(-1, 2, n).view(-1, *[1] * len(input_shape))
    return model, X, torch.randint(0, n_outputs, (n,), generator=gen)


def _text_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    model = build_model(
        "transformer-classifier",
        {"layers": 1, "dim": 16, "heads": 2, "mlp_dim": 24, "vocab_size": 7, "pad_id": 0},
        input_shape=(24,),
        n_outputs=3,
        generator=gen,
    )
    ids = torch.randint(1, 4, (6, 24), generator=gen)  # few distinct tokens: repeated ones in every row
    return model, ids, torch.randint(0, 3, (6,), generator=gen)


def _ghost_rows_within_the_bound(model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> None:
    norms = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=len(X))
    for i in range(len(X)):
        for clip in (float(norms[i]) * 0.25, float(norms[i]) * (1 - 1e-7), float(norms[i])):
            total = ghost_clipped_grad_sum(
                model, X[i : i + 1], y[i : i + 1], loss="cross_entropy", per_sample_map=AbadiClip(clip),
                max_physical_batch_size=1, pass2="bk",
            )  # fmt: skip
            assert _exact_norm(list(total.values())) <= clip * PROVEN, (i, clip)
        # the norm the ghost engine clips with is an upper bound on the row's exact gradient norm
        vmap = clipped_grad_sum(
            model, X[i : i + 1], y[i : i + 1], loss="cross_entropy", per_sample_map=AbadiClip(1e30),
            max_physical_batch_size=1,
        )  # fmt: skip
        assert float(norms[i]) >= _exact_norm(list(vmap.values())) * (1 - 1e-5)


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "materialise"])
@pytest.mark.parametrize("case", IMAGE_MODELS, ids=[c[0] for c in IMAGE_MODELS])
def test_ghost_clipping_keeps_every_row_within_the_bound(case: tuple, gram: bool) -> None:
    model, X, y = _model(case, n=5)
    with mock.patch.object(linear_conv, "_use_gram", lambda *a, **k: gram):
        _ghost_rows_within_the_bound(model, X, y)


def test_ghost_clipping_of_embeddings_with_repeated_tokens_stays_within_the_bound() -> None:
    model, ids, y = _text_model()
    _ghost_rows_within_the_bound(model, ids, y)


def test_the_ghost_scales_are_the_parameters_dtype() -> None:
    scales, finite = ghost_api._chunk_scales(
        torch.tensor([4.0, 0.25], dtype=torch.float64), (AbadiClip(1.0),), dtype=torch.float32, terms=3
    )
    assert scales.dtype == torch.float32 and finite is None
