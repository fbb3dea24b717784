"""The `hf` models (Transformers from a config) under the per-example engines: exact per-example
gradients on the vmap engine, taken by the ghost engine (and by "auto"), padding that never counts.
The ghost engine's own exactness on them: test_worker_ghost_hf.py."""

from __future__ import annotations

import pytest
import torch

from dp.losses import get_loss
from dp.per_example.engines import uses_ghost
from dp.per_example.ghost import check_ghost_supported
from dp.per_example.per_sample import check_supported, iter_per_sample_grads, trainable_parameters
from tests.unit.worker.hf_fixtures import HF_CASES, hf_model
from tests.unit.worker.text_fixtures import PAD, lm_targets, tokens
from training.finetune import apply_finetune, block_members

N = 5


def _batch(task: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    X = tokens(N)
    if task == "causal-lm":
        return X, lm_targets(X), "token_cross_entropy_mean"
    return X, torch.arange(N) % 3, "cross_entropy"


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=[f"{t}-{k}" for t, k in HF_CASES])
def test_per_example_gradients_equal_one_backward_per_example(model_type: str, task: str) -> None:
    """float64: the vmap engine's gradient of row i is the gradient of a forward and backward of row i alone."""
    model = hf_model(model_type, task)
    model.train()
    X, y, loss = _batch(task)
    check_supported(model)
    grads = next(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=N))
    params = trainable_parameters(model)
    assert list(grads) == list(params)
    spec = get_loss(loss)
    for i in range(N):
        expected = torch.autograd.grad(spec.fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values()))
        for name, g in zip(params, expected, strict=True):
            torch.testing.assert_close(grads[name][i], g, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    assert any(float(g.abs().max()) > 0 for g in grads.values())


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=[f"{t}-{k}" for t, k in HF_CASES])
def test_the_ghost_engine_takes_hf_models_and_auto_picks_it(model_type: str, task: str) -> None:
    model = hf_model(model_type, task)
    check_ghost_supported(model)
    assert uses_ghost(model, "auto")


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=[f"{t}-{k}" for t, k in HF_CASES])
def test_padding_never_changes_a_real_positions_output(model_type: str, task: str) -> None:
    """The padding token's embedding never reaches a classifier's logits or a real position's;
    a real token's embedding does (the check is not vacuous)."""
    model = hf_model(model_type, task)
    X = tokens(N)
    real = X != PAD
    seen = real if task == "causal-lm" else slice(None)
    embedding = model.model.get_input_embeddings().weight
    noise = torch.randn(embedding.shape[1], generator=torch.Generator().manual_seed(1), dtype=embedding.dtype)
    with torch.no_grad():
        before = model(X)[seen]
        embedding[PAD].add_(noise)
        torch.testing.assert_close(model(X)[seen], before, rtol=1e-10, atol=1e-12)
        embedding[int(X[0, 0])].add_(noise)
        assert not torch.allclose(model(X)[seen], before)


def test_dropout_is_off_and_a_random_forward_would_be_refused() -> None:
    model = hf_model("bert", "sequence-classification")
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert rates and all(rate == 0.0 for rate in rates)
    next(module for module in model.modules() if isinstance(module, torch.nn.Dropout)).p = 0.1
    model.train()
    X, y, loss = _batch("sequence-classification")
    with pytest.raises(RuntimeError, match="random"):
        next(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=N))


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=[f"{t}-{k}" for t, k in HF_CASES])
def test_fine_tuning_blocks_hold_every_parameter_once(model_type: str, task: str) -> None:
    """The embeddings, each layer, the head: every parameter in exactly one block, and the last block
    is what ``head`` and ``last_k_blocks`` 1 train."""
    model = hf_model(model_type, task)
    members = block_members(model)
    assert list(members) == ["embedding", "layer1", "layer2", "head"]
    owners = [
        block
        for name, _ in model.named_parameters()
        for block, spans in members.items()
        if any(name.startswith(f"{member}.") for member in spans)
    ]
    assert len(owners) == sum(1 for _ in model.named_parameters())  # each parameter in one block
    last_block = apply_finetune(model, mode="last_k_blocks", k=1)
    head_names = {name for name, p in model.named_parameters() if p.requires_grad}
    assert head_names and all(any(name.startswith(f"{m}.") for m in members["head"]) for name in head_names)
    assert apply_finetune(model, mode="head") <= last_block
    assert apply_finetune(model, mode="last_k_blocks", k=4) == sum(p.numel() for p in model.parameters())
