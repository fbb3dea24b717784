"""LoRA fine-tuning: only the adapters train, both engines are exact on them, and the merged model
(what is released) computes what the adapted model computes and loads with no LoRA code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum, ghost_per_sample_norms
from dp.per_example.per_sample import (
    AbadiClip,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
    trainable_parameters,
)
from privtrain_common.model_files import load_model, save_model
from tests.unit.worker.text_fixtures import LENGTH, VOCAB, lm_targets, text_model, tokens
from training.finetune import apply_finetune
from training.lora import LoRAConfig, LoRALinear, apply_lora, merge_lora


def _adapted(name: str = "transformer-lm", *, rank: int = 2, alpha: float = 4.0) -> torch.nn.Module:
    model = text_model(name)
    apply_lora(model, LoRAConfig(rank=rank, alpha=alpha))
    with torch.no_grad():  # a trained-looking update (B starts at zero)
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_b.weight.normal_(std=0.3, generator=torch.Generator().manual_seed(5))
    return model


def test_only_the_adapters_train() -> None:
    model = text_model("transformer-lm")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainable = apply_finetune(model, mode="lora", lora={"rank": 2, "alpha": 8})
    names = list(trainable_parameters(model))
    assert names and all(name.endswith(("lora_a.weight", "lora_b.weight")) for name in names)
    # q, k, v, out and the MLP's two Linears of each of the 2 blocks: 12 adapters
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 12
    assert trainable == sum(p.numel() for p in trainable_parameters(model).values())
    for name, p in model.named_parameters():  # the base weights are kept, frozen
        plain = name.replace(".base.", ".")
        if plain in before:
            assert not p.requires_grad and torch.equal(p, before[plain])


def test_a_fresh_adapter_leaves_the_model_unchanged() -> None:
    model = text_model("transformer-lm")
    X = tokens(4)
    reference = model(X)
    apply_lora(model, LoRAConfig(rank=3, alpha=1.0))
    torch.testing.assert_close(model(X), reference)


@pytest.mark.parametrize("name", ["transformer-lm", "transformer-classifier"])
def test_merged_model_computes_what_the_adapted_model_computes(name: str, tmp_path: Path) -> None:
    model = _adapted(name)
    X = tokens(5)
    adapted = model(X)
    assert merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(X), adapted)
    # The released file is the plain architecture: load_model needs no LoRA code.
    params = {"layers": 2, "dim": 8, "heads": 2, "mlp_dim": 12, "vocab_size": VOCAB, "pad_id": 0}
    lm = name == "transformer-lm"
    path = tmp_path / "m.safetensors"
    save_model(
        path,
        model.float(),
        config={
            "format_version": 1,
            "model": {"name": name, "params": params if lm else {**params, "pooling": "mean"}},
            "input_shape": [LENGTH],
            "n_outputs": VOCAB if lm else 3,
            "task": "language-model" if lm else "classification",
            "lora": {"rank": 2, "alpha": 4.0, "merged": True},
        },
    )
    loaded, config = load_model(path)
    assert config["lora"] == {"rank": 2, "alpha": 4.0, "merged": True}
    torch.testing.assert_close(loaded(X).double(), adapted, rtol=1e-5, atol=1e-5)


def test_merge_without_adapters_is_a_no_op() -> None:
    assert not merge_lora(text_model("transformer-classifier"))


def test_lora_refuses_a_model_without_transformer_layers() -> None:
    from privtrain_common.zoo.architectures import build_model

    mlp = build_model("mlp", {"hidden_sizes": [4]}, input_shape=(3,), n_outputs=2)
    with pytest.raises(ValueError, match="needs a transformer"):
        apply_lora(mlp, LoRAConfig(rank=1, alpha=1.0))


@pytest.mark.parametrize("name", ["transformer-lm", "transformer-classifier"])
def test_ghost_matches_vmap_with_lora(name: str) -> None:
    model = _adapted(name)
    check_ghost_supported(model)
    X = tokens(6)
    lm = name == "transformer-lm"
    y = lm_targets(X) if lm else torch.tensor([0, 1, 2, 0, 1, 2])
    loss = "token_cross_entropy_sum" if lm else "cross_entropy"
    grads = next(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=6))
    assert all(name.endswith(("lora_a.weight", "lora_b.weight")) for name in grads)
    norms = per_sample_norms(grads)
    torch.testing.assert_close(
        ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=4), norms, rtol=1e-9, atol=1e-12
    )
    clip = AbadiClip(float(norms.median()))
    reference = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=6)
    got = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    assert list(got) == list(reference)
    for key, value in reference.items():
        torch.testing.assert_close(got[key], value, rtol=1e-8, atol=1e-10)


def test_vit_takes_adapters_too() -> None:
    from privtrain_common.zoo.architectures import build_model

    vit = build_model(
        "vit",
        {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 12},
        input_shape=(3, 8, 8),
        n_outputs=3,
        generator=torch.Generator().manual_seed(0),
    )
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    reference = vit(x)
    apply_lora(vit, LoRAConfig(rank=2, alpha=2.0))
    assert sum(isinstance(m, LoRALinear) for m in vit.modules()) == 12
    check_ghost_supported(vit)
    torch.testing.assert_close(vit(x), reference)
