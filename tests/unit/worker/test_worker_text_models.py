"""Text models (transformer-classifier, transformer-lm) and the language-model loss in both engines.

Masks: padding never changes a real position's output and the LM is causal. Loss: a row's token
losses, summed or averaged over its non-ignored next tokens, one term per row. Engines: the ghost
engine's per-sample norms and clipped sums equal the vmap engine's on batches with padding, and a
per-row brute-force loop shows every row's contribution is its own gradient clipped to C.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.losses import IGNORED_TARGET, get_loss, loss_for_task
from dp.per_example.ghost import check_ghost_supported, ghost_clipped_grad_sum, ghost_per_sample_norms
from dp.per_example.per_sample import (
    AbadiClip,
    check_supported,
    clipped_grad_sum,
    iter_per_sample_grads,
    per_sample_norms,
    trainable_parameters,
)
from tests.unit.worker.per_sample_grads_check import assert_ghost_per_sample_grads_match
from tests.unit.worker.text_fixtures import LENGTH, PAD, VOCAB, lm_targets, text_model, tokens

N = 7
# (id, model name, extra params, loss)
CASES = [
    ("classifier-mean", "transformer-classifier", {"pooling": "mean"}, "cross_entropy"),
    ("classifier-first", "transformer-classifier", {"pooling": "first"}, "cross_entropy"),
    ("lm-mean", "transformer-lm", {}, "token_cross_entropy_mean"),
    ("lm-sum", "transformer-lm", {}, "token_cross_entropy_sum"),
]


def _case(case: tuple) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor, str]:
    _, name, params, loss = case
    model = text_model(name, **params)
    X = tokens(N)
    y = (
        lm_targets(X)
        if name == "transformer-lm"
        else torch.randint(0, 3, (N,), generator=torch.Generator().manual_seed(1))
    )
    return model, X, y, loss


def _assert_close(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], tol: float = 1e-9) -> None:
    assert list(got) == list(ref)
    total = float(torch.sqrt(sum(r.square().sum() for r in ref.values())))
    for name, r in ref.items():
        assert float((got[name] - r).norm()) <= tol * (float(r.norm()) + 1e-3 * total), name


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("name", ["transformer-classifier", "transformer-lm"])
def test_padding_embedding_never_reaches_a_real_position(name: str) -> None:
    """Padding is masked out of attention (and of mean pooling): changing the pad token's embedding
    changes no classifier output and no LM logit at a real position."""
    model = text_model(name)
    X = tokens(N)
    before = model(X)
    with torch.no_grad():
        model.embedding.weight[PAD].add_(5.0)
    after = model(X)
    if name == "transformer-lm":
        real = X != PAD
        torch.testing.assert_close(after[real], before[real])
    else:
        torch.testing.assert_close(after, before)


def test_language_model_is_causal() -> None:
    """Changing the token at position t changes no logit at a position before t."""
    model = text_model("transformer-lm")
    X = tokens(N)
    X[:, :] = torch.where(X == PAD, torch.ones_like(X), X)  # no padding: every position real
    for t in range(1, LENGTH):
        changed = X.clone()
        changed[:, t] = changed[:, t] % (VOCAB - 1) + 1
        torch.testing.assert_close(model(changed)[:, :t], model(X)[:, :t])
        assert not torch.allclose(model(changed)[:, t], model(X)[:, t])


def test_an_all_padding_row_gives_finite_outputs() -> None:
    X = torch.full((2, LENGTH), PAD)
    for name in ("transformer-classifier", "transformer-lm"):
        assert torch.isfinite(text_model(name)(X)).all()


def test_vit_is_unchanged_by_the_optional_masks() -> None:
    """SelfAttention without a mask and not causal computes what it did before masks existed."""
    from privtrain_common.zoo.architectures import SelfAttention

    torch.manual_seed(0)
    attention = SelfAttention(8, 2).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    q, k, v = (t.reshape(3, 5, 2, 4).transpose(1, 2) for t in (attention.q(x), attention.k(x), attention.v(x)))
    reference = attention.out((q @ k.transpose(-1, -2) / 2.0).softmax(-1).matmul(v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attention(x), reference)


# ----------------------------------------------------------------------------- the loss


def _reference_row_loss(logits: torch.Tensor, targets: torch.Tensor, reduce: str) -> torch.Tensor:
    terms = [
        F.cross_entropy(logits[t].unsqueeze(0), targets[t + 1].unsqueeze(0))
        for t in range(targets.shape[0] - 1)
        if targets[t + 1] != IGNORED_TARGET
    ]
    if not terms:
        return torch.zeros((), dtype=logits.dtype)
    total = torch.stack(terms).sum()
    return total / len(terms) if reduce == "mean" else total


@settings(max_examples=25, deadline=None, database=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=LENGTH), min_size=1, max_size=4),
    reduce=st.sampled_from(["mean", "sum"]),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_token_loss_is_a_sum_of_per_row_next_token_losses(lengths: list[int], reduce: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(lengths), LENGTH, VOCAB, generator=gen, dtype=torch.float64)
    ids = torch.randint(1, VOCAB, (len(lengths), LENGTH), generator=gen)
    for row, length in enumerate(lengths):
        ids[row, length:] = PAD
    targets = lm_targets(ids)
    got = get_loss(f"token_cross_entropy_{reduce}").fn(logits, targets)
    expected = sum(_reference_row_loss(logits[i], targets[i], reduce) for i in range(len(lengths)))
    torch.testing.assert_close(got, torch.as_tensor(expected, dtype=torch.float64))


def test_task_loss_registry() -> None:
    assert loss_for_task("classification") == "cross_entropy"
    assert loss_for_task("regression") == "mse"
    assert loss_for_task("language-model") == "token_cross_entropy_mean"
    assert loss_for_task("language-model", token_loss="sum") == "token_cross_entropy_sum"
    with pytest.raises(ValueError, match="no loss for task"):
        loss_for_task("translation")


def test_token_loss_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="logits"):
        get_loss("token_cross_entropy_mean").fn(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64))


# ----------------------------------------------------------------------------- engines


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ghost_matches_vmap_on_text_models(case: tuple) -> None:
    model, X, y, loss = _case(case)
    check_ghost_supported(model)
    check_supported(model)
    grads = next(iter_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=N))
    norms = per_sample_norms(grads)
    ghost_norms = ghost_per_sample_norms(model, X, y, loss=loss, max_physical_batch_size=3)
    torch.testing.assert_close(ghost_norms, norms, rtol=1e-9, atol=1e-12)
    clip = AbadiClip(float(norms.median()))  # some rows clipped, some not
    reference = clipped_grad_sum(model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=4)
    for pass2 in ("bk", "retain", "recompute"):
        got = ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=clip, max_physical_batch_size=3, pass2=pass2
        )
        _assert_close(got, reference)
    assert_ghost_per_sample_grads_match(model, X, y, loss, chunk=3, tol=1e-9)


@pytest.mark.parametrize("case", CASES[::2], ids=[c[0] for c in CASES[::2]])
def test_each_row_contributes_its_own_gradient_clipped_to_c(case: tuple) -> None:
    """Brute force, one row at a time with plain autograd: the engines' sum is Σ_i clip_C(∇ℓ_i), and
    each clipped term has norm ≤ C (a row, however many tokens it has, is one privacy unit)."""
    model, X, y, loss = _case(case)
    params = trainable_parameters(model)
    spec = get_loss(loss)
    C = 0.05
    expected = {name: torch.zeros_like(p) for name, p in params.items()}
    for i in range(N):
        row_grads = torch.autograd.grad(spec.fn(model(X[i : i + 1]), y[i : i + 1]), list(params.values()))
        norm = torch.sqrt(sum(g.square().sum() for g in row_grads))
        scale = min(1.0, C / float(norm)) if float(norm) > 0 else 1.0  # a one-token LM row predicts nothing
        clipped_norm = float(norm) * scale
        assert clipped_norm <= C * (1 + 1e-12)
        for name, g in zip(params, row_grads, strict=True):
            expected[name] += scale * g
    for engine in (clipped_grad_sum, ghost_clipped_grad_sum):
        got = engine(model, X, y, loss=loss, per_sample_map=AbadiClip(C), max_physical_batch_size=2)
        _assert_close(got, expected)
