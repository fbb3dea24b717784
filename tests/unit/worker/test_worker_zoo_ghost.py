"""The image zoo (wrn, resnet-gn, cnn, vit) in the ghost engine, against the vmap engine.

Same pattern as test_worker_ghost.py: norms and clipped sums of every pass-2 mode and chunking
equal torch.func's per-sample gradients, and a DP-SGD run with ghost clipping equals the run
with the vmap engine under the same noise seed.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn

from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from dp.per_example.ghost import (
    GhostClipAggregator,
    check_ghost_supported,
    ghost_clipped_grad_sum,
    ghost_container,
    ghost_per_sample_norms,
    linear_conv,
)
from dp.per_example.ghost.standardised_conv import standardisation_vjp
from dp.per_example.per_sample import (
    AbadiClip,
    check_supported,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
    supported_module,
)
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import PositionalEmbedding, TokenPrepend, WSConv2d, build_model
from tests.unit.worker.per_sample_grads_check import assert_ghost_per_sample_grads_match

MODES = ("bk", "retain", "recompute")
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}

# (id, model name, params, input_shape (C, H, W), n_outputs)
TINY = [
    ("wrn-ws", "wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, (3, 8, 8), 3),
    ("wrn-plain", "wrn", {"depth": 10, "width": 1, "groups": 2, "weight_standardisation": False}, (1, 6, 6), 2),
    ("resnet-gn", "resnet-gn", {"blocks": [1, 1], "width": 4, "groups": 2}, (3, 8, 8), 3),
    ("cnn", "cnn", {"channels": [4, 8], "groups": 2, "activation": "tanh", "pooling": "avg"}, (3, 8, 8), 3),
    ("cnn-max", "cnn", {"channels": [4], "groups": 4}, (1, 6, 6), 2),
    ("vit", "vit", {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12}, (3, 8, 8), 3),
    ("vit-1head", "vit", {"patch_size": 2, "dim": 6, "depth": 1, "heads": 1, "mlp_dim": 6}, (1, 4, 6), 2),
]


def _tiny(case: tuple, dtype: torch.dtype, n: int = 7) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    _, name, params, input_shape, n_outputs = case
    gen = torch.Generator().manual_seed(7)
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=gen).to(dtype)
    X = torch.randn(n, *input_shape, generator=gen, dtype=dtype)
    y = torch.randint(0, n_outputs, (n,), generator=gen)
    return model, X, y


def _assert_sums_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], tol: float) -> None:
    """Relative to each parameter's sum, with a floor of 1e-3 of the whole sum's norm: some sums are
    zero up to rounding (attention's key bias cannot change a softmax, nor a conv bias a GroupNorm
    with one channel per group), so their rounding is compared with the gradient as a whole."""
    assert list(got) == list(ref)
    total = float(torch.sqrt(sum(r.double().square().sum() for r in ref.values())))
    for name, r in ref.items():
        g = got[name]
        assert g.shape == r.shape and g.dtype == r.dtype, name
        scale = float(r.norm()) + 1e-3 * total
        assert float((g - r).norm()) <= tol * scale, (name, float((g - r).norm()) / scale)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", TINY, ids=[c[0] for c in TINY])
def test_image_zoo_matches_vmap_engine(case: tuple, dtype: torch.dtype) -> None:
    model, X, y = _tiny(case, dtype)
    check_ghost_supported(model)  # no per-sample fallback
    check_supported(model)
    tol = TOL[dtype]
    vmap_model = copy.deepcopy(model)
    ref_norms = torch.cat(
        [
            per_sample_norms(g)
            for g in iter_per_sample_grads(vmap_model, X, y, loss="cross_entropy", max_physical_batch_size=3)
        ]
    )
    assert bool((ref_norms > 0).all())
    clip = AbadiClip(float(ref_norms.median()))  # about half of the rows clipped
    reference = clipped_grad_sum(vmap_model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=4)
    for chunk in (3, 64):
        norms = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=chunk)
        torch.testing.assert_close(norms, ref_norms, rtol=tol, atol=tol * 1e-3)
        for mode in MODES:
            got = ghost_clipped_grad_sum(
                model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=chunk, pass2=mode
            )
            _assert_sums_close(got, reference, tol)
        assert_ghost_per_sample_grads_match(model, X, y, "cross_entropy", chunk=chunk, tol=tol)
    assert all(p.grad is None for p in model.parameters())
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("case", [TINY[0], TINY[2], TINY[3], TINY[5]], ids=["wrn", "resnet-gn", "cnn", "vit"])
def test_dp_sgd_step_with_ghost_clipping_equals_the_vmap_engine(case: tuple) -> None:
    config = DPSGDConfig(
        steps=2,
        sampling_probability=0.6,
        noise_multiplier=1.0,
        clipping_norm=0.5,
        learning_rate=0.1,
        momentum=0.9,
        max_physical_batch_size=4,
    )
    trained = []
    for aggregator in (PerSampleMapAggregator(AbadiClip(0.5)), GhostClipAggregator(AbadiClip(0.5))):
        model, X, y = _tiny(case, torch.float64, n=9)
        before = copy.deepcopy(model.state_dict())
        train_dp_sgd(model, X, y, config=config, generator=SecureRandom.from_seed(11), aggregator=aggregator)
        trained.append(model.state_dict())
    assert any(not torch.equal(before[k], v) for k, v in trained[0].items())  # it trained
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-9, atol=1e-12)


def test_standardisation_vjp_is_the_jacobian_transpose() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 2, 3, 3, generator=gen, dtype=torch.float64)
    upstream = torch.randn(5, 4, 2, 3, 3, generator=gen, dtype=torch.float64)
    conv = WSConv2d(2, 4, 3).to(torch.float64)
    with torch.no_grad():
        conv.weight.copy_(weight)
    for i in range(upstream.shape[0]):
        w = weight.clone().requires_grad_(True)
        conv.weight = nn.Parameter(w)
        (expected,) = torch.autograd.grad(conv.effective_weight(), conv.weight, grad_outputs=upstream[i])
        got = standardisation_vjp(conv.weight, conv.eps, upstream[i : i + 1])[0]
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_weight_standardised_conv_reused_and_on_a_residual_path() -> None:
    """A WSConv2d called twice, inside and beside a residual, with a class token model's bare
    parameters reused too: every call's contribution is summed."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = WSConv2d(2, 2, 3, padding=1)
            self.head = nn.Linear(2 * 4 * 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.conv(x)
            return self.head((self.conv(torch.tanh(h)) + h).flatten(1))

    ghost_container(supported_module(Twice))
    gen = torch.Generator().manual_seed(5)
    model = Twice().to(torch.float64)
    X = torch.randn(6, 2, 4, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (6,), generator=gen)
    ref = torch.cat(
        [
            per_sample_norms(g)
            for g in iter_per_sample_grads(copy.deepcopy(model), X, y, loss="cross_entropy", max_physical_batch_size=6)
        ]
    )
    got = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=6)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-13)


def test_token_layers_reused_add_their_calls() -> None:
    class Reused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token = TokenPrepend(3)
            self.position = PositionalEmbedding(3, 3)
            self.head = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.position(self.token(x))  # (B, 3, 3)
            h = self.position(torch.tanh(h))
            return self.head(self.token(h)[:, :2].sum(dim=1))

    ghost_container(supported_module(Reused))
    gen = torch.Generator().manual_seed(9)
    model = Reused().to(torch.float64)
    X = torch.randn(5, 2, 3, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 2, (5,), generator=gen)
    ref = torch.cat(
        [
            per_sample_norms(g)
            for g in iter_per_sample_grads(copy.deepcopy(model), X, y, loss="cross_entropy", max_physical_batch_size=5)
        ]
    )
    got = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=5)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("gram", [True, False], ids=["gram", "materialise"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_grouped_strided_weight_standardised_conv_in_both_conv_forms(gram: bool, bias: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    model = nn.Sequential(
        WSConv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=bias), nn.Tanh(), nn.Flatten(), nn.Linear(6 * 3 * 3, 3)
    ).to(torch.float64)
    X = torch.randn(6, 4, 5, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (6,), generator=gen)
    ref = torch.cat(
        [
            per_sample_norms(g)
            for g in iter_per_sample_grads(copy.deepcopy(model), X, y, loss="cross_entropy", max_physical_batch_size=6)
        ]
    )
    clip = AbadiClip(float(ref.median()))
    reference = clipped_grad_sum(
        copy.deepcopy(model), X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=6
    )
    with mock.patch.object(linear_conv, "_use_gram", lambda *a, **k: gram):
        got_norms = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=4)
        got = ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=4, pass2="bk"
        )
    torch.testing.assert_close(got_norms, ref, rtol=1e-10, atol=1e-13)
    _assert_sums_close(got, reference, 1e-10)


@pytest.mark.parametrize("case", [TINY[0], TINY[5]], ids=["wrn-ws", "vit"])
def test_frozen_parameters_get_no_gradient_and_the_rest_stay_exact(case: tuple) -> None:
    """Fine-tuning freezes parameters: the weight-standardised convs' weights (biases still
    train) and the class token are frozen here; the others match the vmap engine."""
    model, X, y = _tiny(case, torch.float64)
    frozen: set[str] = set()
    for name, p in model.named_parameters():
        if name.endswith("token") or (p.dim() == 4 and name.endswith("weight")):
            p.requires_grad_(False)
            frozen.add(name)
    clip = AbadiClip(0.1)
    reference = clipped_grad_sum(
        copy.deepcopy(model), X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=7
    )
    got = ghost_clipped_grad_sum(model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=7)
    assert frozen and frozen.isdisjoint(got)
    _assert_sums_close(got, reference, 1e-10)
