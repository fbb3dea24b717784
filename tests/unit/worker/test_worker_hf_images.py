"""The `hf` image classifiers (ViT, ConvNeXt from a config) under the per-example engines: exact
per-example gradients on the vmap engine; ViT exact on the ghost engine too (its CLS token and
position embeddings have a rule), ConvNeXt refused by it (its layer scale has none), so that
"auto" picks vmap for it."""

from __future__ import annotations

import pytest
import torch

from dp.losses import get_loss
from dp.per_example.engines import uses_ghost
from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum
from dp.per_example.per_sample import (
    AbadiClip,
    check_supported,
    clipped_grad_sum,
    iter_per_sample_grads,
    trainable_parameters,
)
from tests.unit.worker.hf_image_fixtures import CLASSES, IMAGE_TYPES, image_config, image_model, images
from training.finetune import apply_finetune, block_members

N = 4


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_per_example_gradients_equal_one_backward_per_example(model_type: str) -> None:
    """float64: the vmap engine's gradient of image i is that of a forward and backward of image i alone."""
    model = image_model(model_type)
    model.train()
    X, y = images(N), torch.arange(N) % CLASSES
    check_supported(model)
    grads = next(iter_per_sample_grads(model, X, y, loss="cross_entropy", max_physical_batch_size=N))
    params = trainable_parameters(model)
    assert list(grads) == list(params)
    spec = get_loss("cross_entropy")
    for i in range(N):
        expected = torch.autograd.grad(spec.fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values()))
        for name, g in zip(params, expected, strict=True):
            torch.testing.assert_close(grads[name][i], g, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    assert all(float(g.abs().max()) > 0 for g in grads.values())  # the CLS token, positions, layer scale too


def test_the_ghost_engine_refuses_convnext_and_auto_picks_vmap() -> None:
    model = image_model("convnext")
    with pytest.raises(ValueError, match="layer scale is a bare parameter"):
        check_ghost_supported(model)
    assert not uses_ghost(model, "auto")


def test_vit_on_the_ghost_engine_equals_vmap_and_brute_force() -> None:
    """float64, every parameter trained (the CLS token, the position embeddings and the patch Conv2d
    among them); the bound is the median norm, so some rows are clipped and some not."""
    model = image_model("vit")
    check_ghost_supported(model)
    assert uses_ghost(model, "auto")
    X, y = images(5), torch.arange(5) % CLASSES
    params = trainable_parameters(model)
    spec = get_loss("cross_entropy")
    rows = [
        dict(
            zip(
                params,
                torch.autograd.grad(spec.fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values())),
                strict=True,
            )
        )
        for i in range(5)
    ]
    norms = [float(torch.cat([g.flatten() for g in row.values()]).norm()) for row in rows]
    bound = sorted(norms)[2]
    expected = {
        name: sum((1.0 if n <= bound else bound / n) * row[name] for row, n in zip(rows, norms, strict=True))
        for name in params
    }
    clip = AbadiClip(bound)
    ghost = ghost_clipped_grad_sum(model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=3)
    vmapped = clipped_grad_sum(model, X, y, loss="cross_entropy", per_sample_map=clip, max_physical_batch_size=3)
    assert {"model.vit.embeddings.cls_token", "model.vit.embeddings.position_embeddings"} <= set(ghost)
    for name, value in expected.items():
        torch.testing.assert_close(ghost[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(vmapped[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_fine_tuning_blocks_hold_every_parameter_once(model_type: str) -> None:
    model = image_model(model_type)
    members = block_members(model)
    unit = "stage" if model_type == "convnext" else "layer"
    assert list(members) == ["embedding", f"{unit}1", f"{unit}2", "head"]
    owners = [
        block
        for name, _ in model.named_parameters()
        for block, spans in members.items()
        if any(name.startswith(f"{member}.") for member in spans)
    ]
    assert len(owners) == sum(1 for _ in model.named_parameters())
    trained = apply_finetune(model, mode="head")
    head = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained and all(any(name.startswith(f"{m}.") for m in members["head"]) for name in head)


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_dropout_and_stochastic_depth_are_off(model_type: str) -> None:
    model = image_model(model_type)
    config = model.model.config
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob", "drop_path_rate")
    rates = [getattr(config, key) for key in keys if hasattr(config, key)]
    assert rates and all(rate == 0.0 for rate in rates)
    assert not any(isinstance(m, torch.nn.Dropout) and m.p for m in model.modules())
    assert not any(type(m).__name__ == "ConvNextDropPath" for m in model.modules())


def test_convnext_without_layer_scale_builds_and_is_exact_on_vmap() -> None:
    model = image_model("convnext", config={**image_config("convnext"), "layer_scale_init_value": 0.0})
    assert not any("layer_scale" in name for name, _ in model.named_parameters())
    X, y = images(2), torch.tensor([0, 1])
    grads = next(iter_per_sample_grads(model, X, y, loss="cross_entropy", max_physical_batch_size=2))
    expected = torch.autograd.grad(
        get_loss("cross_entropy").fn(model(X[1:]), y[1:]), list(trainable_parameters(model).values())
    )
    for g, e in zip(grads.values(), expected, strict=True):
        torch.testing.assert_close(g[1], e, rtol=1e-10, atol=1e-12)
