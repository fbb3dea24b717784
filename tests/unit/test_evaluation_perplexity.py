"""DP perplexity of a language model: the plan and its charge, per-row clipping of the mean token
loss, the exp mapping of the released value and its interval, the all-padding row, and the worker's
noise and release."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from dp.data.tokens import TokenRows, language_model_targets
from dp.losses import IGNORED_TARGET, get_loss
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.jobs.evaluation import (
    CONFIDENCE,
    DEFAULT_LOSS_CLIP_SOURCE,
    EvaluationPlan,
    InvalidEvaluation,
    default_loss_clip,
    plan_evaluation,
    released_metric,
)
from kernel.schemas.jobs import EvaluationSpec
from privtrain_common.zoo.architectures import build_model
from worker import evaluation

VOCAB = 20
PAD = 0
LM = DatasetFacts(n_rows=1000, feature_shape=(6,), task="language-model", n_classes=None, vocab_size=VOCAB, pad_id=PAD)
CLASSIFICATION = DatasetFacts(n_rows=1000, feature_shape=(3,), task="classification", n_classes=2)
REGRESSION = DatasetFacts(n_rows=1000, feature_shape=(3,), task="regression", n_classes=None)


def _laplace(epsilon: float = 0.5, **fields: float) -> EvaluationPlan:
    return plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=epsilon, **fields), LM)


def _release(plan: EvaluationPlan, noisy_sum: float) -> dict:
    tail = evaluation.NOISE_TAILS[plan.mechanism]
    return released_metric(
        plan,
        noisy_sum=noisy_sum,
        noise_half_width_on_sum=tail.half_width(plan, plan.noise_scale, (1 - CONFIDENCE) / 2),
        noise_distribution=tail.distribution,
    )


# ----------------------------------------------------------------------------- plan


def test_default_clip_is_twice_the_uniform_loss_and_laplace_epsilon_is_r_over_b() -> None:
    plan = _laplace(epsilon=0.5)
    assert plan.metric == "perplexity"
    assert plan.sensitivity == pytest.approx(2 * math.log(20)) == default_loss_clip(VOCAB)
    assert plan.sensitivity_source == DEFAULT_LOSS_CLIP_SOURCE
    assert plan.noise_scale == pytest.approx(2 * 2 * math.log(20))  # b = R / ε
    assert plan.sensitivity / plan.noise_scale == pytest.approx(0.5)  # closed form: ε = R / b
    assert plan.expected_holdout_rows == pytest.approx(200.0)
    assert plan.event() == privacy.LaplaceEvent(noise_multiplier=2.0, count=1)
    assert plan.describe()["sensitivity_source"] == DEFAULT_LOSS_CLIP_SOURCE


def test_a_given_loss_clip_is_the_sensitivity() -> None:
    plan = _laplace(epsilon=0.25, loss_clip=3.0)
    assert (plan.sensitivity, plan.noise_scale, plan.sensitivity_source) == (3.0, 12.0, None)
    gaussian = plan_evaluation(
        EvaluationSpec(holdout_fraction=0.1, mechanism="gaussian", noise_multiplier=2.0, loss_clip=5.0), LM
    )
    assert gaussian.noise_scale == 10.0 and gaussian.event() == privacy.GaussianEvent(noise_multiplier=2.0, count=1)


@pytest.mark.parametrize(
    ("facts", "fields", "message"),
    [
        (LM, {"error_clip": 1.0}, "evaluation.error_clip applies to regression datasets"),
        (CLASSIFICATION, {"loss_clip": 1.0}, "evaluation.loss_clip applies to language-model datasets"),
        (CLASSIFICATION, {"error_clip": 1.0}, "evaluation.error_clip applies to regression datasets"),
        (REGRESSION, {"loss_clip": 1.0, "error_clip": 1.0}, "evaluation.loss_clip applies to language-model"),
        (dataclasses.replace(LM, vocab_size=None), {}, "evaluation.loss_clip is needed"),
        (dataclasses.replace(LM, vocab_size=1), {}, "fewer than 2 tokens"),
    ],
)
def test_fields_that_do_not_apply_are_refused(facts: DatasetFacts, fields: dict[str, float], message: str) -> None:
    spec = EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=1.0, **fields)
    with pytest.raises(InvalidEvaluation, match=message):
        plan_evaluation(spec, facts)


def test_loss_clip_is_bounded_so_its_perplexity_is_finite() -> None:
    with pytest.raises(ValueError):
        EvaluationSpec(holdout_fraction=0.2, mechanism="laplace", epsilon=1.0, loss_clip=1000.0)


# ----------------------------------------------------------------------------- released values

noisy_sums = st.one_of(
    st.floats(min_value=-1e5, max_value=1e5, allow_nan=False),
    st.sampled_from([-math.inf, math.inf, 0.0, 200.0 * 2.5]),
)


@given(noisy=noisy_sums, gaussian=st.booleans())
@settings(max_examples=200, deadline=None)
def test_perplexity_is_exp_of_the_released_mean_token_loss_and_so_is_its_interval(noisy: float, gaussian: bool) -> None:
    plan = (
        plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", noise_multiplier=2.0), LM)
        if gaussian
        else _laplace()
    )
    released = _release(plan, noisy)
    (loss_row,) = released["also_released"]
    loss = released["mean_token_loss"]
    assert loss_row["metric"] == "mean_token_loss" and loss_row["mean_token_loss"] == loss
    assert 0.0 <= loss <= plan.sensitivity
    assert loss == min(max(noisy / plan.expected_holdout_rows, 0.0), plan.sensitivity)
    assert released["perplexity"] == pytest.approx(math.exp(loss))
    assert released["valid_range"] == pytest.approx([1.0, math.exp(plan.sensitivity)])
    assert released["clamped"] == loss_row["clamped"] == (loss != noisy / plan.expected_holdout_rows)
    low, high = loss_row["interval"]["low"], loss_row["interval"]["high"]
    assert 0.0 <= low <= loss <= high <= plan.sensitivity
    interval = released["interval"]
    assert (interval["low"], interval["high"]) == pytest.approx((math.exp(low), math.exp(high)))
    assert interval["confidence"] == CONFIDENCE and "public quantities only" in interval["covers"]
    # the noise is on the summed token loss: its scale is shown on the mean token loss row only
    assert released["noise_scale"] is None
    assert loss_row["noise_scale"] == released["noise_scale_on_mean_token_loss"]
    assert loss_row["noise_scale"] == pytest.approx(plan.noise_scale / plan.expected_holdout_rows)
    assert released["metric"] == "perplexity" and released["loss_clip"] == plan.sensitivity


# ----------------------------------------------------------------------------- per-row losses


def _reference_mean_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """Position by position, independently of the vectorised code."""
    means = []
    for row_logits, row_targets in zip(logits.double(), targets, strict=True):
        losses = [
            -torch.log_softmax(row_logits[t], dim=-1)[int(row_targets[t + 1])].item()
            for t in range(len(row_targets) - 1)
            if int(row_targets[t + 1]) != IGNORED_TARGET
        ]
        means.append(sum(losses) / len(losses) if losses else 0.0)
    return means


def test_mean_token_losses_per_row_with_an_all_padding_row() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, VOCAB, generator=gen)
    targets = torch.tensor(
        [
            [3, 4, 5, 6, 7],
            [3, 4, IGNORED_TARGET, IGNORED_TARGET, IGNORED_TARGET],
            [IGNORED_TARGET] * 5,  # all padding: no target, adds 0
            [9, IGNORED_TARGET, IGNORED_TARGET, IGNORED_TARGET, IGNORED_TARGET],  # one token: nothing to predict
        ]
    )
    logits[2] = math.nan  # whatever a model makes of a row of padding, it counts for 0
    got = evaluation.mean_token_losses(logits, targets)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(_reference_mean_token_loss(logits, targets))
    assert got[2] == 0.0 and got[3] == 0.0
    # the training loss sums the same per-row means
    finite = torch.tensor([0, 1, 3])
    training = get_loss("token_cross_entropy_mean").fn(logits[finite], targets[finite])
    assert float(training) == pytest.approx(float(got[finite].sum()), rel=1e-5)


class _Bigram(nn.Module):
    """Logits from the previous token alone: a tiny LM whose losses are easy to push past the clip."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.table = nn.Embedding(VOCAB, VOCAB)
        with torch.no_grad():
            self.table.weight.normal_(generator=torch.Generator().manual_seed(1)).mul_(scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.table(tokens)
        return out


row_tokens = st.lists(st.integers(min_value=0, max_value=VOCAB - 1), min_size=6, max_size=6)


@given(rows=st.lists(row_tokens, min_size=1, max_size=6), extra=row_tokens, scale=st.sampled_from([0.1, 50.0]))
@settings(max_examples=40, deadline=None)
def test_one_more_held_out_row_moves_the_sum_by_at_most_the_clip(
    rows: list[list[int]], extra: list[int], scale: float
) -> None:
    plan = _laplace(loss_clip=1.5)
    model = _Bigram(scale)

    def summed(token_rows: list[list[int]]) -> float:
        tokens = torch.tensor(token_rows)
        targets = torch.where(tokens == PAD, IGNORED_TARGET, tokens)
        return evaluation.metric_sum(model, tokens, targets, plan)

    base, more = summed(rows), summed([*rows, extra])
    assert -1e-9 <= more - base <= plan.sensitivity + 1e-9
    if scale == 50.0 and any(token != PAD for token in extra[1:]):
        assert more - base == pytest.approx(plan.sensitivity)  # losses in the hundreds: clipped to R


def test_chunks_cover_every_row_once() -> None:
    plan = _laplace()
    model = _Bigram(1.0)
    tokens = torch.randint(1, VOCAB, (50, 6), generator=torch.Generator().manual_seed(2))
    whole = evaluation.metric_sum(model, tokens, tokens, plan)
    original = evaluation.EVAL_CHUNK_TOKENS
    try:
        evaluation.EVAL_CHUNK_TOKENS = 6 * 7  # 7 rows a chunk: 8 chunks, the last one short
        chunked = evaluation.metric_sum(model, tokens, tokens, plan)
    finally:
        evaluation.EVAL_CHUNK_TOKENS = original
    assert chunked == pytest.approx(whole)


# ----------------------------------------------------------------------------- worker noise and release


def test_laplace_noise_on_the_token_loss_sum_is_the_charged_one() -> None:
    plan = _laplace(epsilon=0.5, loss_clip=2.0)
    rng = SecureRandom.from_seed(3)
    draws = np.array([evaluation.noisy_sum(plan, 0.0, rng) for _ in range(8000)])
    assert stats.kstest(draws, stats.laplace(scale=4.0).cdf).pvalue > 1e-3  # b = R / ε = 2 / 0.5


def test_gaussian_noise_on_the_token_loss_sum_is_the_charged_one() -> None:
    plan = plan_evaluation(
        EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", noise_multiplier=3.0, loss_clip=2.0), LM
    )
    rng = SecureRandom.from_seed(4)
    draws = np.array([evaluation.noisy_sum(plan, 0.0, rng) for _ in range(8000)])
    assert stats.kstest(draws, stats.norm(scale=6.0).cdf).pvalue > 1e-3


def test_release_on_a_tiny_transformer_lm_matches_the_true_perplexity_at_negligible_noise() -> None:
    model = build_model(
        "transformer-lm",
        {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8, "vocab_size": VOCAB, "pad_id": PAD},
        input_shape=(6,),
        n_outputs=VOCAB,
        generator=torch.Generator().manual_seed(0),
    )
    stored = np.array(
        [
            [5, 6, 7, 8, 9, 10],
            [11, 12, 13, PAD, PAD, PAD],
            [PAD] * 6,
            [3, 3, 4, PAD, PAD, PAD],
            [19, 1, 2, 18, 17, PAD],
        ]
        * 40,
        dtype=np.uint16,
    )
    rows = TokenRows(stored)
    targets = language_model_targets(rows, pad_id=PAD)
    facts = dataclasses.replace(LM, n_rows=1000)
    plan = dataclasses.replace(  # f·n = 200 = the rows given; noise far below the losses
        plan_evaluation(EvaluationSpec(holdout_fraction=0.2, mechanism="gaussian", noise_multiplier=1.0), facts),
        noise_multiplier=1e-9,
    )
    model.train()  # release must switch to eval mode itself
    released = evaluation.release(model, rows, targets, plan)
    assert not model.training

    with torch.no_grad():
        logits = model(torch.from_numpy(stored.astype(np.int64)))
    per_row = [min(loss, plan.sensitivity) for loss in _reference_mean_token_loss(logits, targets)]
    true_loss = sum(per_row) / len(per_row)
    assert 0.0 < true_loss < plan.sensitivity
    assert released["mean_token_loss"] == pytest.approx(true_loss, rel=1e-6)
    assert released["perplexity"] == pytest.approx(math.exp(true_loss), rel=1e-6)
    assert released["interval"]["low"] <= released["perplexity"] <= released["interval"]["high"]
