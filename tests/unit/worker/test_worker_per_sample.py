"""The per-sample gradient engine against ordinary autograd, one sample at a time."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dp.losses import get_loss, prepare_targets
from dp.per_example.clip_margin import clip_target
from dp.per_example.per_sample import (
    SUPPORTED_MODULES,
    AbadiClip,
    check_supported,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
    supported_module,
    trainable_parameters,
)
from privtrain_common.zoo.architectures import build_model

# (id, model name, params, input_shape, n_outputs, loss)
Case = tuple[str, str, dict[str, object], tuple[int, ...], int, str]
CASES: list[Case] = [
    ("logistic", "logistic-regression", {}, (5,), 3, "cross_entropy"),
    ("linear-mse", "linear-regression", {}, (4,), 1, "mse"),
    ("mlp-tanh", "mlp", {"hidden_sizes": [6, 4], "activation": "tanh"}, (5,), 3, "cross_entropy"),
    ("mlp-relu-mse", "mlp", {"hidden_sizes": [7], "activation": "relu"}, (3,), 1, "mse"),
    ("cnn2-gn", "cnn2-gn", {"groups": 4, "image_shape": None}, (1, 16, 16), 4, "cross_entropy"),
    ("cnn2-gn-flat", "cnn2-gn", {"groups": 2, "image_shape": [1, 16, 16]}, (256,), 4, "cross_entropy"),
]
CASE_IDS = [case[0] for case in CASES]


def _setup(case: Case, n: int = 10) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    """A float64 model (so comparisons can be tight) and a random batch."""
    _, name, params, input_shape, n_outputs, loss = case
    gen = torch.Generator().manual_seed(1234)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen).double()
    X = torch.randn(n, *input_shape, generator=gen, dtype=torch.float64)
    if loss == "cross_entropy":
        y = torch.randint(0, n_outputs, (n,), generator=gen)
    else:
        y = torch.randn(n, generator=gen, dtype=torch.float64)
    return model, X, y, loss


def _reference_grads(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: str) -> list[dict[str, torch.Tensor]]:
    """Ordinary autograd, one row at a time: the definition of a per-sample gradient."""
    spec = get_loss(loss)
    dtype = next(model.parameters()).dtype
    rows = []
    for i in range(X.shape[0]):
        model.zero_grad(set_to_none=True)
        target = prepare_targets(spec, y[i : i + 1], dtype=dtype)
        spec.fn(model(X[i : i + 1]), target).backward()
        rows.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    return rows


def _flat_norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads.values()))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_per_sample_grads_equal_one_at_a_time_autograd(case: Case) -> None:
    model, X, y, loss = _setup(case)
    reference = _reference_grads(model, X, y, loss)
    chunks = list(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=4))
    assert [next(iter(c.values())).shape[0] for c in chunks] == [4, 4, 2]
    engine = {name: torch.cat([c[name] for c in chunks]) for name in chunks[0]}
    assert list(engine) == [n for n, _ in model.named_parameters()]
    for i, ref in enumerate(reference):
        for name, g in ref.items():
            torch.testing.assert_close(engine[name][i], g, rtol=1e-9, atol=1e-12)
        assert any(bool(g.abs().sum() > 0) for g in ref.values())  # not trivially zero
    for name, p in model.named_parameters():
        assert p.grad is None, name  # the engine never touches .grad


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_clipped_sum_matches_reference_and_chunking_does_not_change_it(case: Case) -> None:
    model, X, y, loss = _setup(case)
    reference = _reference_grads(model, X, y, loss)
    norms = sorted(_flat_norm(r) for r in reference)
    clip_norm = norms[len(norms) // 2]  # about half the rows get clipped
    expected = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for ref in reference:
        # Flat L2 norm over ALL parameters jointly, not per layer.
        scale = min(1.0, clip_norm / _flat_norm(ref))
        for name, g in ref.items():
            expected[name] += scale * g
    clip = AbadiClip(clip_norm)
    chunked = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3)
    whole = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=10)
    for name in expected:
        torch.testing.assert_close(chunked[name], expected[name], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(whole[name], chunked[name], rtol=1e-12, atol=1e-14)
        assert chunked[name].shape == dict(model.named_parameters())[name].shape


def test_joint_norm_differs_from_per_layer_clipping() -> None:
    """Guards the 'flat norm over all parameters' rule with a case where it matters."""
    model, X, y, loss = _setup(CASES[2])
    (grads,) = list(iter_per_sample_grads(model, X[:1], y[:1], loss=loss, max_physical_batch_size=1))
    joint = float(per_sample_norms(grads)[0])
    per_layer_max = max(float(g.norm()) for g in grads.values())
    assert joint > per_layer_max * 1.0001
    clip_norm = (joint + per_layer_max) / 2  # clips jointly, would not clip any single layer
    total = clipped_grad_sum(
        model, X[:1], y[:1], loss=loss, per_sample_map=AbadiClip(clip_norm), max_physical_batch_size=1
    )
    assert _flat_norm(total) == pytest.approx(clip_norm, rel=1e-12)


def test_clipped_per_sample_norms_are_bounded_and_small_rows_unchanged() -> None:
    model, X, y, loss = _setup(CASES[4], n=12)
    X = X * torch.linspace(0.01, 3.0, 12, dtype=torch.float64).view(-1, 1, 1, 1)
    (grads,) = list(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=12))
    norms = per_sample_norms(grads)
    clip_norm = float(norms.median())
    clip = AbadiClip(clip_norm)
    scale = clip.scale_factors(norms)
    below = norms <= clip_target(clip_norm, norms.dtype)  # the map clips to the target C·(1 − κ)
    assert 0 < int(below.sum()) < 12
    assert torch.equal(scale[below], torch.ones_like(scale[below]))  # bit-identical
    clipped = {name: g * scale.view(-1, *[1] * (g.dim() - 1)) for name, g in grads.items()}
    clipped_norms = per_sample_norms(clipped)
    assert bool((clipped_norms <= clip_norm * (1 + 1e-12)).all())
    torch.testing.assert_close(clipped_norms[~below], torch.full_like(clipped_norms[~below], clip_norm))
    assert bool((clipped_norms[~below] <= clip_norm).all())


@settings(max_examples=200, deadline=None)
@given(
    norms=st.lists(st.floats(min_value=0.0, max_value=1e30, allow_nan=False), min_size=1, max_size=20),
    clip_norm=st.floats(min_value=1e-6, max_value=1e6),
)
def test_abadi_scale_factors_bound_every_norm(norms: list[float], clip_norm: float) -> None:
    t = torch.tensor(norms, dtype=torch.float32)
    scale = AbadiClip(clip_norm).scale_factors(t)
    assert bool(((scale > 0) & (scale <= 1)).all())
    assert bool((scale * t <= clip_norm * (1 + 1e-6)).all())
    assert bool((scale[t <= clip_target(clip_norm, t.dtype)] == 1).all())


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_abadi_clip_rejects_invalid_norms(bad: float) -> None:
    with pytest.raises(ValueError):
        AbadiClip(bad)


def test_rows_with_non_finite_gradients_contribute_nothing() -> None:
    """A NaN/inf row must not turn the released sum into NaN (that would reveal it was sampled)."""
    model, X, y, loss = _setup(CASES[0])
    clip = AbadiClip(0.5)
    clean = clipped_grad_sum(model, X[2:], y[2:], loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    poisoned_X = X.clone()
    poisoned_X[0, 0] = float("inf")
    poisoned_X[1, 1] = float("nan")
    poisoned = clipped_grad_sum(model, poisoned_X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    for name in clean:
        assert bool(torch.isfinite(poisoned[name]).all())
        torch.testing.assert_close(poisoned[name], clean[name], rtol=1e-12, atol=1e-14)


def test_empty_batch_gives_zero_sum() -> None:
    model, X, y, loss = _setup(CASES[0])
    total = clipped_grad_sum(model, X[:0], y[:0], loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4)
    for name, p in trainable_parameters(model).items():
        assert torch.equal(total[name], torch.zeros_like(p))


def test_frozen_parameters_are_left_out() -> None:
    model, X, y, loss = _setup(CASES[2])
    model[1].weight.requires_grad_(False)
    total = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=AbadiClip(1.0), max_physical_batch_size=4)
    assert "1.weight" not in total and "1.bias" in total


@pytest.mark.parametrize(
    ("layer", "message"),
    [(nn.BatchNorm1d(4), "BatchNorm"), (nn.Dropout(0.1), "not supported")],
)
def test_unsupported_layers_are_refused(layer: nn.Module, message: str) -> None:
    model = nn.Sequential(nn.Linear(3, 4), layer, nn.Linear(4, 2))
    with pytest.raises(ValueError, match=message):
        check_supported(model)
    with pytest.raises(ValueError, match=message):
        clipped_grad_sum(
            model,
            torch.zeros(2, 3),
            torch.zeros(2, dtype=torch.int64),
            loss="cross_entropy",
            per_sample_map=AbadiClip(1.0),
            max_physical_batch_size=2,
        )


def test_custom_modules_need_explicit_registration() -> None:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.inner(x)

    model = nn.Sequential(Residual(), nn.Linear(3, 2))
    with pytest.raises(ValueError, match="Residual"):
        check_supported(model)
    supported_module(Residual)
    try:
        check_supported(model)
    finally:
        SUPPORTED_MODULES.discard(Residual)


def test_mse_refuses_multi_column_outputs() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="one output per row"):
        clipped_grad_sum(
            model,
            torch.zeros(2, 3),
            torch.zeros(2),
            loss="mse",
            per_sample_map=AbadiClip(1.0),
            max_physical_batch_size=2,
        )


def test_cross_entropy_refuses_float_labels() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="integer class labels"):
        clipped_grad_sum(
            model,
            torch.zeros(2, 3),
            torch.zeros(2),
            loss="cross_entropy",
            per_sample_map=AbadiClip(1.0),
            max_physical_batch_size=2,
        )
