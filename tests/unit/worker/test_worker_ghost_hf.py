"""The ghost engine on the `hf` models (Transformers from a config), in float64: its clipped sum equals
the vmap engine's and a brute-force one (a forward and backward per row, clipped, summed); the
rules of Transformers' own layers (GPT-2's Conv1D, Llama's and Qwen2's RMSNorm) give each row's
squared norm, weighted sum and gradient as torch.func does; the per-row ids HFModel passes leave
its outputs bit-identical; configurations the containers were not read for are refused.
Transformers is imported inside the tests (as the engine does), not when the suite is collected."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dp.losses import get_loss
from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum, iter_ghost_per_sample_grads
from dp.per_example.ghost.work import LayerWork, Totals
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum, trainable_parameters
from tests.unit.worker.hf_fixtures import HF_CASES, hf_model
from tests.unit.worker.text_fixtures import PAD, lm_targets, tokens

N = 5
IDS = [f"{t}-{k}" for t, k in HF_CASES]


def _batch(task: str) -> tuple[torch.Tensor, torch.Tensor, str]:
    X = tokens(N)
    if task == "causal-lm":
        return X, lm_targets(X), "token_cross_entropy_mean"
    return X, torch.arange(N) % 3, "cross_entropy"


def _brute_force(model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: str) -> list[dict[str, torch.Tensor]]:
    """Each row's gradient from a forward and backward of that row alone."""
    params = trainable_parameters(model)
    spec = get_loss(loss)
    rows = []
    for i in range(X.shape[0]):
        grads = torch.autograd.grad(spec.fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values()))
        rows.append(dict(zip(params, grads, strict=True)))
    return rows


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=IDS)
def test_ghost_clipped_sum_equals_the_vmap_engine_and_brute_force(model_type: str, task: str) -> None:
    """Rows with padding included; the bound is the median norm, so some rows are clipped and some not."""
    model = hf_model(model_type, task)
    X, y, loss = _batch(task)
    assert bool((X == PAD).any(dim=1).sum() >= 2)  # several rows carry padding
    rows = _brute_force(model, X, y, loss)
    norms = torch.stack([torch.cat([g.flatten() for g in row.values()]).norm() for row in rows])
    bound = float(norms.median())
    clip = AbadiClip(bound)
    scales = [1.0 if float(n) <= bound else bound / float(n) for n in norms]  # a row with no target: 0
    expected = {name: sum(s * row[name] for row, s in zip(rows, scales, strict=True)) for name in rows[0]}
    ghost = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3)
    vmapped = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3)
    assert list(ghost) == list(expected)
    for name, value in expected.items():
        torch.testing.assert_close(ghost[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(vmapped[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    assert any(float(g.abs().max()) > 0 for g in ghost.values())


@pytest.mark.parametrize(("model_type", "task"), [("gpt2", "causal-lm"), ("qwen2", "sequence-classification")])
def test_ghost_per_example_gradients_equal_brute_force(model_type: str, task: str) -> None:
    """The gradients themselves (Conv1D's in its (in, out) layout, RMSNorm's), not only their sum."""
    model = hf_model(model_type, task)
    X, y, loss = _batch(task)
    rows = _brute_force(model, X, y, loss)
    grads = next(iter_ghost_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=N))
    for i, row in enumerate(rows):
        for name, g in row.items():
            torch.testing.assert_close(grads[name][i], g, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=IDS)
def test_per_row_ids_leave_the_outputs_bit_identical(model_type: str, task: str) -> None:
    """HFModel's (B, T) position and token type ids are the ids the model would make itself."""
    model = hf_model(model_type, task)
    X = tokens(N)
    mask = model.attention_mask(X, torch.float64)
    extra = {"use_cache": False} if model.decoder else {}
    with torch.no_grad():
        assert torch.equal(model(X), model.model(input_ids=X, attention_mask=mask, **extra).logits)


def _per_example(module: nn.Module, a: torch.Tensor, d: torch.Tensor) -> dict[str, torch.Tensor]:
    """torch.func's per-example gradients of Σ output·δ for each row."""
    params = {name: p.detach() for name, p in module.named_parameters()}

    def row(p: dict[str, torch.Tensor], a_i: torch.Tensor, d_i: torch.Tensor) -> torch.Tensor:
        return (functional_call(module, p, (a_i.unsqueeze(0),)) * d_i.unsqueeze(0)).sum()

    return vmap(grad(row), in_dims=(None, 0, 0))(params, a, d)


def _check_work(work: LayerWork, expected: dict[str, torch.Tensor]) -> None:
    """Squared norms, per-example gradients and two weighted sums against the expected gradients."""
    sq = sum(g.flatten(1).square().sum(dim=1) for g in expected.values())
    assert isinstance(sq, torch.Tensor)
    assert work.sq_norms.dtype == torch.float64
    torch.testing.assert_close(work.sq_norms, sq, rtol=1e-10, atol=1e-12)
    for name, g in work.per_sample().items():
        torch.testing.assert_close(g.reshape(expected[name].shape), expected[name], rtol=1e-10, atol=1e-12)
    weights = torch.rand(2, sq.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(sq.shape[0], dtype=torch.bool)
    mask[1] = False
    totals = [Totals(), Totals()]
    work.accumulate(weights, mask, totals)
    for total, w in zip(totals, weights, strict=True):
        for name, g in expected.items():
            want = torch.tensordot(w * mask, g, dims=1)
            torch.testing.assert_close(total.sums[name].reshape(want.shape), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 3, 6), (4, 6)], ids=["sequence", "rows"])
@pytest.mark.parametrize("gram", [True, False], ids=["gram", "materialised"])
def test_conv1d_rule_matches_torch_func(shape: tuple[int, ...], gram: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.pytorch_utils import Conv1D

    from dp.per_example.ghost.hf_layers import conv1d_work

    monkeypatch.setattr("dp.per_example.ghost.linear_conv._use_gram", lambda *args, **kwargs: gram)
    torch.manual_seed(0)
    module = Conv1D(5, 6).double()
    with torch.no_grad():
        module.bias.normal_()
    a = torch.randn(*shape, dtype=torch.float64)
    d = torch.randn(*shape[:-1], 5, dtype=torch.float64)
    expected = _per_example(module, a, d)
    work = conv1d_work(module, {"weight": "weight", "bias": "bias"}, [(a, d)], bk=True)
    _check_work(work, expected)


def test_conv1d_rule_of_a_reused_layer_adds_its_calls() -> None:
    from transformers.pytorch_utils import Conv1D

    from dp.per_example.ghost.hf_layers import conv1d_work

    torch.manual_seed(1)
    module = Conv1D(3, 4).double()
    a1, a2 = torch.randn(4, 2, 4, dtype=torch.float64), torch.randn(4, 5, 4, dtype=torch.float64)
    d1, d2 = torch.randn(4, 2, 3, dtype=torch.float64), torch.randn(4, 5, 3, dtype=torch.float64)
    first, second = _per_example(module, a1, d1), _per_example(module, a2, d2)
    expected = {name: first[name] + second[name] for name in first}
    _check_work(conv1d_work(module, {"weight": "weight", "bias": "bias"}, [(a1, d1), (a2, d2)], bk=True), expected)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rms_norm_rule_matches_torch_func(family: str, dtype: torch.dtype) -> None:
    """float64 inputs go through the layer's float32 normalisation too: the rule repeats it exactly."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    from dp.per_example.ghost.hf_layers import rms_norm_work

    cls = {"llama": LlamaRMSNorm, "qwen2": Qwen2RMSNorm}[family]
    torch.manual_seed(2)
    module = cls(6, eps=1e-5).to(dtype)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    a = 3 * torch.randn(4, 3, 6, dtype=dtype)
    d = torch.randn(4, 3, 6, dtype=dtype)
    expected = _per_example(module, a, d)
    work = rms_norm_work(module, {"weight": "weight"}, [(a, d)], bk=True)
    if dtype == torch.float64:
        _check_work(work, expected)
    else:  # float32 sums in another order: the float32 rounding of a sum of three
        torch.testing.assert_close(work.per_sample()["weight"], expected["weight"], rtol=1e-6, atol=1e-6)


def test_refused_configurations_name_the_module() -> None:
    model = hf_model("bert", "sequence-classification")
    next(m for m in model.modules() if isinstance(m, nn.Dropout)).p = 0.1
    with pytest.raises(ValueError, match=r"\(Dropout\) has p=0.1"):
        check_ghost_supported(model)
    model = hf_model("llama", "causal-lm")
    model.model.model.layers[0].gradient_checkpointing = True
    with pytest.raises(ValueError, match=r"model\.model\.layers\.0 \(LlamaDecoderLayer\) has gradient checkpointing"):
        check_ghost_supported(model)
    model = hf_model("gpt2", "causal-lm")
    model.model.config._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="'sdpa' attention"):
        check_ghost_supported(model)


def test_the_ghost_package_imports_and_works_without_transformers() -> None:
    """Transformers is an optional extra: without it the ghost package imports and takes the zoo."""
    script = (
        "import sys; sys.modules['transformers'] = None\n"
        "import torch\n"
        "from dp.per_example.ghost import supports\n"
        "from dp.per_example.ghost.optional import load_optional_families\n"
        "load_optional_families()\n"
        "assert supports(torch.nn.Sequential(torch.nn.Linear(2, 2)))\n"
        "assert 'dp.per_example.ghost.hf_layers' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
