"""The ghost engine's layer registry: one decorator makes a new layer type work, nothing else does.

The toy layer below is registered the way a new layer family module would register itself. Its
per-sample norms and clipped sums are checked against per-sample gradients materialised directly
with torch.func (the vmap engine would refuse the toy layer, so it cannot be the reference here).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dp.per_example.ghost import (
    GHOST_LAYERS,
    check_ghost_supported,
    ghost_clipped_grad_sum,
    ghost_layer,
    ghost_per_sample_norms,
    supports,
)
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, materialised_work
from dp.per_example.per_sample import AbadiClip

MODES = ("bk", "retain", "recompute")


class _Scale(nn.Module):
    """y = x ⊙ scale over the last dimension: a layer with a parameter the engine did not know."""

    def __init__(self, features: int, *, squash: bool = False) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, features))
        self.squash = squash

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale
        return torch.tanh(y) if self.squash else y


def _refuse_squash(module: _Scale) -> str | None:
    return "squashes, which the toy rule does not describe" if module.squash else None


@ghost_layer(_Scale, refusal=_refuse_squash, parameters=("scale",))
def _scale_work(module: _Scale, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """g_i = Σ over positions of δ ⊙ a; a reused layer's calls add up."""
    name = names["scale"]
    assert name is not None
    batch, features = calls[0][0].shape[0], module.scale.shape[0]
    g = sum((d * a).reshape(batch, -1, features).sum(dim=1) for a, d in calls)
    assert isinstance(g, torch.Tensor)
    return materialised_work({name: g})


class _UnregisteredScale(_Scale):
    """Same forward, but not registered: exact types only, so it must be refused."""


class _Offset(nn.Module):
    """A layer type with a parameter and no rule at all."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offset


def _model(scale: nn.Module) -> nn.Module:
    """The layer on (B, 4) rows, then reused on (B, 3, 4) positions: both calls add up."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 4),
        scale,
        nn.Tanh(),
        nn.Linear(4, 12),
        nn.Unflatten(1, (3, 4)),
        scale,
        nn.Flatten(),
        nn.Linear(12, 3),
    ).double()


def _materialised_grads(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """name -> (n, *shape) per-sample gradients of the summed cross-entropy, by torch.func.

    On a copy: functional_call leaves a layer that is called twice with plain-tensor weights."""
    model = copy.deepcopy(model)
    params = {name: p.detach() for name, p in model.named_parameters()}

    def loss_of_row(p: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return F.cross_entropy(out, t.unsqueeze(0), reduction="sum")

    return vmap(grad(loss_of_row), in_dims=(None, 0, 0))(params, X, y)


def _data(n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(n, 4, generator=gen, dtype=torch.float64) * 2
    y = torch.randint(0, 3, (n,), generator=gen)
    return X, y


def test_the_built_in_layer_families_register_themselves() -> None:
    for cls in (nn.Linear, nn.Conv1d, nn.Conv2d, nn.GroupNorm, nn.LayerNorm, nn.Embedding):
        assert cls in GHOST_LAYERS
    assert nn.Conv3d not in GHOST_LAYERS


def test_one_decorator_makes_a_new_layer_type_exact() -> None:
    model = _model(_Scale(4))
    assert supports(model)
    X, y = _data()
    per_sample = _materialised_grads(model, X, y)
    expected_norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(dim=1) for g in per_sample.values()))
    assert float(per_sample["1.scale"].norm()) > 0  # the toy layer really gets a gradient
    clip = AbadiClip(float(expected_norms.median()))  # about half of the rows clipped
    scales = clip.scale_factors(expected_norms)
    expected_sum = {name: torch.tensordot(scales, g, dims=1) for name, g in per_sample.items()}
    for chunk in (3, 7):
        norms = ghost_per_sample_norms(model, X, y, loss="cross_entropy", max_physical_batch_size=chunk)
        torch.testing.assert_close(norms, expected_norms, rtol=1e-10, atol=1e-13)
        for mode in MODES:
            got = ghost_clipped_grad_sum(
                model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=chunk, pass2=mode
            )
            assert list(got) == list(expected_sum)
            for name, value in expected_sum.items():
                torch.testing.assert_close(got[name], value, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (_UnregisteredScale(4), r"module 1 of type _UnregisteredScale is not supported"),
        (_Offset(4), r"module 1 of type _Offset is not supported"),
        (nn.PReLU(4), r"module 1 of type PReLU is not supported"),
    ],
    ids=["subclass-of-registered", "custom", "torch-prelu"],
)
def test_an_unregistered_layer_with_parameters_is_refused(layer: nn.Module, message: str) -> None:
    model = _model(layer)
    assert not supports(model)
    with pytest.raises(ValueError, match=message):
        check_ghost_supported(model)
    X, y = _data()
    with pytest.raises(ValueError, match=message):
        ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=4
        )


def test_a_rule_refuses_its_own_unsupported_configurations() -> None:
    model = _model(_Scale(4, squash=True))
    with pytest.raises(ValueError, match=r"module 1 \(_Scale\) squashes, which the toy rule"):
        check_ghost_supported(model)


def test_a_parameter_the_rule_does_not_cover_is_refused() -> None:
    scale = _Scale(4)
    scale.register_parameter("bias", nn.Parameter(torch.zeros(4)))
    with pytest.raises(
        ValueError,
        match=r"parameter 'bias' of module 1 \(_Scale\) is not the "
        r"scale of a layer",
    ):
        check_ghost_supported(_model(scale))
    scale.bias.requires_grad_(False)  # a frozen extra parameter gets no gradient: fine
    assert supports(_model(scale))


def test_a_layer_type_cannot_be_registered_twice_or_without_a_class() -> None:
    with pytest.raises(ValueError, match="Linear registered twice"):
        ghost_layer(nn.Linear)(_scale_work)
    with pytest.raises(ValueError, match="at least one module class"):
        ghost_layer()
