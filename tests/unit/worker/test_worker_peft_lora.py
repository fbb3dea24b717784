"""LoRA on `hf` models through PEFT (training/peft_lora.py): what trains, exact per-example
gradients in both engines, and the release: PEFT's own adapter format and merged weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import save_file
from torch import nn

from dp.losses import get_loss
from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum, trainable_parameters
from tests.unit.worker.hf_fixtures import HF_CASES, hf_model
from tests.unit.worker.hf_image_fixtures import IMAGE_TYPES, image_model, images
from tests.unit.worker.text_fixtures import lm_targets, tokens
from training.finetune import apply_finetune
from training.peft_lora import apply_peft_lora, release_adapter

N = 5
CASES = [
    ("bert", "sequence-classification"),
    ("gpt2", "causal-lm"),
    ("gpt2", "sequence-classification"),
    ("llama", "causal-lm"),
]


def _batch(task: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    X = tokens(N)
    if task == "causal-lm":
        return X, lm_targets(X), "token_cross_entropy_mean"
    return X, torch.arange(N) % 3, "cross_entropy"


def _with_adapters(model: nn.Module, **lora: object) -> nn.Module:
    """The model with PEFT's adapters, their B made non-zero so that they change the output."""
    apply_finetune(model, mode="lora", lora={"rank": 2, "alpha": 4.0, **lora})
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return model


@pytest.mark.parametrize(("model_type", "task"), CASES)
def test_only_adapters_and_a_classifiers_head_train(model_type: str, task: str) -> None:
    model = hf_model(model_type, task)
    trainable = apply_finetune(model, mode="lora", lora={"rank": 2, "alpha": 4.0})
    names = list(trainable_parameters(model))
    assert trainable == sum(p.numel() for p in trainable_parameters(model).values())
    adapters = [n for n in names if ".lora_A." in n or ".lora_B." in n]
    heads = [n for n in names if ".modules_to_save." in n]
    assert adapters and sorted(adapters + heads) == sorted(names)
    assert bool(heads) == (task != "causal-lm")  # a classifier's head trains, an LM head stays frozen
    default = {"bert": ("query", "value"), "gpt2": ("c_attn",), "llama": ("q_proj", "v_proj")}[model_type]
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapters} == set(default)


@pytest.mark.parametrize(("model_type", "task"), CASES)
def test_ghost_equals_vmap_equals_brute_force_with_adapters(model_type: str, task: str) -> None:
    """float64; the bound is the median norm, so some rows are clipped and some not."""
    model = _with_adapters(hf_model(model_type, task))
    check_ghost_supported(model)
    X, y, loss = _batch(task)
    params = trainable_parameters(model)
    rows = []
    for i in range(N):
        grads = torch.autograd.grad(get_loss(loss).fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values()))
        rows.append(dict(zip(params, grads, strict=True)))
    norms = [float(torch.cat([g.flatten() for g in row.values()]).norm()) for row in rows]
    bound = sorted(norms)[N // 2]
    scales = [1.0 if n <= bound else bound / n for n in norms]  # a row with no target: norm 0
    expected = {name: sum(s * row[name] for row, s in zip(rows, scales, strict=True)) for name in params}
    clip = AbadiClip(bound)
    ghost = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3)
    vmapped = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3)
    for name, value in expected.items():
        torch.testing.assert_close(ghost[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(vmapped[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    assert any(float(g.abs().max()) > 0 for name, g in ghost.items() if "lora_A" in name)


def test_a_lora_dropout_is_refused_by_the_ghost_engine_with_its_reason() -> None:
    model = hf_model("bert", "sequence-classification")
    apply_peft_lora(model, rank=2, alpha=4.0)
    layer = model.get_submodule("model.bert.encoder.layer.0.attention.self.query")
    layer.lora_dropout["default"] = nn.Dropout(0.1)
    with pytest.raises(ValueError, match="LoRA dropout above 0"):
        check_ghost_supported(model)


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_image_models_take_adapters_and_train_exactly(model_type: str) -> None:
    """On the vmap engine, and ViT on the ghost engine too (ConvNeXt's layer scale has no ghost rule)."""
    model = _with_adapters(image_model(model_type))
    X, y = images(4), torch.arange(4) % 3
    params = trainable_parameters(model)
    assert any("lora_A" in n for n in params) and any("modules_to_save" in n for n in params)
    loss = get_loss("cross_entropy").fn
    rows = [torch.autograd.grad(loss(model(X[i : i + 1]), y[i : i + 1]), list(params.values())) for i in range(4)]
    summed = clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1e9), max_physical_batch_size=3
    )
    ghost = (
        ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1e9), max_physical_batch_size=3
        )
        if model_type == "vit"
        else summed
    )
    for index, (name, value) in enumerate(summed.items()):
        reference = sum(row[index] for row in rows)
        torch.testing.assert_close(value, reference, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(ghost[name], reference, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def _built(model_type: str, task: str) -> nn.Module:
    return image_model(model_type) if task == "image-classification" else hf_model(model_type, task)


@pytest.mark.parametrize(
    ("model_type", "task"), [*HF_CASES, *((model_type, "image-classification") for model_type in IMAGE_TYPES)]
)
def test_the_released_adapter_loads_with_peft_and_the_merged_model_is_the_same_function(
    model_type: str, task: str, tmp_path: Path
) -> None:
    """Every family: the adapter as PEFT saves it, PeftModel.from_pretrained(base, folder), gives the
    trained model's outputs; the merged model (the plain Transformers architecture) gives them too."""
    base = _built(model_type, task)
    base_state = {name: tensor.clone() for name, tensor in base.get_submodule("model").state_dict().items()}
    model = _with_adapters(base, target_modules=["c_attn", "c_proj"] if model_type == "gpt2" else None)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "modules_to_save" in name:
                parameter.add_(1.0)  # the head trained too
    X = images(N) if task == "image-classification" else tokens(N)
    model.eval()
    expected = model(X)
    adapter = release_adapter(model)
    assert adapter is not None and release_adapter(model) is None  # released once, then plain
    assert not any("lora" in name or "modules_to_save" in name for name in model.state_dict())
    torch.testing.assert_close(model(X), expected, rtol=1e-10, atol=1e-10)  # merged: the same function
    save_file(adapter.tensors, str(tmp_path / "adapter_model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "adapter_config.json").write_text(json.dumps(adapter.config))
    assert adapter.config["r"] == 2 and adapter.config["lora_alpha"] == 4.0 and adapter.config["peft_type"] == "LORA"
    fresh = _built(model_type, task)
    fresh.get_submodule("model").load_state_dict(base_state)
    fresh.model = PeftModel.from_pretrained(fresh.get_submodule("model"), str(tmp_path))
    fresh.eval()
    torch.testing.assert_close(fresh(X), expected, rtol=1e-10, atol=1e-10)
