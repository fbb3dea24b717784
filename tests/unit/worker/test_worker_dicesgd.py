"""DiceSGD worker (docs/algorithms/dicesgd.md): the EF map (T1), the recursion and noise isolation
(T2-T4), degenerate equivalences (T5-T6), bias removal on toy problems (T7-T9), the Adam and
automatic variants (T10-T11), checkpoint/resume with e, and the charged-noise conformance (P6).

"Noise off" below is the worker-level config σ = 0 (DPSGDConfig.noise_multiplier), a test-only
switch: the API only accepts σ > 0 or a target ε (tests/api/test_api_dicesgd.py checks that).
"""

from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from algorithms.dicesgd import aggregator as dicesgd_module
from algorithms.dicesgd.aggregator import (
    ERROR_FEEDBACK_CHECKPOINT_KEY,
    ErrorFeedbackAggregator,
    ErrorFeedbackClip,
    ErrorFeedbackNormalise,
    apply_feedback_map,
    train_dicesgd,
)
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.per_example.per_sample import AbadiClip
from dp.per_example.per_sample_maps import AutoSClip
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import JobPlan, plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_training_state, save_training_state


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rng(seed: int) -> SecureRandom:
    """A fixed-seed noise stream: tests only."""
    return SecureRandom.from_seed(seed)


def _norm(tensors: dict[str, torch.Tensor]) -> float:
    return float(torch.cat([t.flatten().double() for t in tensors.values()]).norm())


# ----------------------------------------------------------------------------- toy problems


def _scalar_model(x0: float = 0.0) -> nn.Module:
    """x is the single weight of Linear(1, 1); rows have input 1, so the output is x."""
    model = nn.Sequential(nn.Linear(1, 1, bias=False)).double()
    with torch.no_grad():
        model[0].weight.fill_(x0)
    return model


def _x(model: nn.Module) -> float:
    return float(model[0].weight.detach().item())


def _toy_data(xi: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared loss (x − ξ)²: per-sample gradient 2(x − ξ); optimum = mean(ξ)."""
    return torch.ones(len(xi), 1, dtype=torch.float64), torch.tensor(xi, dtype=torch.float64)


def _config(*, steps: int, q: float, batch: float, lr: float, sigma: float = 0.0) -> DPSGDConfig:
    return DPSGDConfig(
        steps=steps,
        sampling_probability=q,
        noise_multiplier=sigma,
        clipping_norm=1.0,
        learning_rate=lr,
        loss="mse",
        max_physical_batch_size=256,
        expected_batch_size=batch,
    )


def _dice(c1: float, c2: float, batch: float) -> ErrorFeedbackAggregator:
    return ErrorFeedbackAggregator(
        per_sample_map=AbadiClip(c1), feedback_map=ErrorFeedbackClip(c2), expected_batch_size=batch
    )


def _run_dice(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    aggregator: ErrorFeedbackAggregator,
    config: DPSGDConfig,
    *,
    seed: int = 0,
    hooks: TrainingHooks | None = None,
    resume_from: TrainingState | None = None,
) -> TrainingResult:
    return train_dicesgd(
        model,
        X,
        y,
        config=config,
        aggregator=aggregator,
        generator=_rng(seed),
        hooks=hooks,
        resume_from=resume_from,
    )


def _run_dpsgd(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, c1: float, config: DPSGDConfig, *, seed: int = 0
) -> TrainingResult:
    return train_dp_sgd(
        model, X, y, config=config, generator=_rng(seed), aggregator=PerSampleMapAggregator(AbadiClip(c1))
    )


# ----------------------------------------------------------------------------- T1: ψ


def test_clip_keeps_short_vectors_and_clips_long_ones_to_exactly_c2() -> None:
    clip = ErrorFeedbackClip(1.0)
    short = {"a": torch.tensor([0.3, 0.4]), "b": torch.tensor([0.0])}
    assert torch.equal(apply_feedback_map(clip, short)["a"], short["a"])
    # global norm: each tensor alone is below 1, jointly 5 — per-tensor clipping would keep them
    long = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}
    clipped = apply_feedback_map(clip, long)
    assert _norm(clipped) == pytest.approx(1.0, rel=1e-6)
    assert _norm(clipped) <= 1.0
    assert torch.allclose(clipped["a"] / clipped["b"], torch.tensor([0.75, 0.0]))
    zero = apply_feedback_map(clip, {"a": torch.zeros(3)})
    assert torch.equal(zero["a"], torch.zeros(3))
    assert torch.equal(apply_feedback_map(ErrorFeedbackClip(0.0), long)["a"], torch.zeros(2))


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.floats(min_value=-(2.0**100), max_value=2.0**100, allow_nan=False, width=32), min_size=1, max_size=12
    ),
    c2=st.floats(min_value=1e-6, max_value=1e4),
    gamma=st.floats(min_value=1e-6, max_value=1e4),
)
def test_feedback_maps_never_exceed_their_bound(values: list[float], c2: float, gamma: float) -> None:
    """The sensitivity C1/B + 2·C2 needs ||ψ(e)|| ≤ C2 for EVERY e, float32 rounding included."""
    e = {"a": torch.tensor(values, dtype=torch.float32)}
    for feedback_map in (ErrorFeedbackClip(c2), ErrorFeedbackNormalise(gamma)):
        out = apply_feedback_map(feedback_map, e)
        assert torch.isfinite(out["a"]).all()
        assert _norm(out) <= feedback_map.norm_bound


def test_feedback_bound_holds_where_a_float32_scale_would_be_subnormal() -> None:
    """‖e‖ near float32's limit and a small C2: the scale (about 3e-47) is below float32's
    smallest value, so it must multiply in float64; rounded to float32 it would be 0 or 1.4e-45
    (a 40-fold overshoot of the bound)."""
    e = {"a": torch.full((10_000,), 3.0e38, dtype=torch.float32)}
    out = apply_feedback_map(ErrorFeedbackClip(1e-6), e)
    assert 0 < _norm(out) <= 1e-6


def test_feedback_bound_holds_where_the_product_is_subnormal() -> None:
    """A C2 near float32's smallest values: ψ's entries would round up on the subnormal grid
    by more than the shrink covers (1.12e-44 for C2 = 1.065e-44 before); they become 0."""
    c2 = 7.6 * 2.0**-149
    out = apply_feedback_map(ErrorFeedbackClip(c2), {"a": torch.tensor([1.0])})
    assert _norm(out) <= c2


def test_feedback_is_the_same_scaled_a_block_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(3)
    e = {"a": torch.randn(7, 5, generator=generator), "b": torch.randn(11, generator=generator)}
    whole = apply_feedback_map(ErrorFeedbackClip(0.5), e)
    monkeypatch.setattr(dicesgd_module, "_FEEDBACK_BLOCK", 4)
    blocked = apply_feedback_map(ErrorFeedbackClip(0.5), e)
    for name in e:  # the norm sums its blocks' norms: equal up to float64 rounding
        torch.testing.assert_close(whole[name], blocked[name], rtol=1e-6, atol=0.0)
    assert _norm(blocked) <= 0.5
    e["a"][0, 0] = float("inf")
    assert all(not bool(t.any()) for t in apply_feedback_map(ErrorFeedbackClip(0.5), e).values())


def test_non_finite_error_maps_to_zero() -> None:
    e = {"a": torch.tensor([float("inf"), 1.0]), "b": torch.tensor([float("nan")])}
    for feedback_map in (ErrorFeedbackClip(1.0), ErrorFeedbackNormalise(0.01)):
        out = apply_feedback_map(feedback_map, e)
        assert all(torch.equal(t, torch.zeros_like(t)) for t in out.values())


def test_normalisation_of_a_zero_error_is_zero_not_nan() -> None:
    out = apply_feedback_map(ErrorFeedbackNormalise(0.01), {"a": torch.zeros(4)})
    assert torch.equal(out["a"], torch.zeros(4))


# ----------------------------------------------------------------------------- T2/T4/T6: one step


def _reference_step(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, c1: float, batch: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Independent per-row autograd: (c̄, ḡ) on the averaged scale."""
    params = dict(model.named_parameters())
    clipped = {k: torch.zeros_like(p) for k, p in params.items()}
    plain = {k: torch.zeros_like(p) for k, p in params.items()}
    for i in range(X.shape[0]):
        model.zero_grad()
        loss = nn.functional.cross_entropy(model(X[i : i + 1]), y[i : i + 1], reduction="sum")
        grads = torch.autograd.grad(loss, list(params.values()))
        norm = torch.cat([g.flatten() for g in grads]).norm()
        factor = min(1.0, c1 / float(norm))
        for (k, _), g in zip(params.items(), grads, strict=True):
            clipped[k] += factor * g / batch
            plain[k] += g / batch
    return clipped, plain


def test_one_step_matches_algorithm_2_and_keeps_noise_out_of_e() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3)).double()
    X, y = torch.randn(12, 5, dtype=torch.float64) * 3, torch.randint(0, 3, (12,))
    c1, c2, batch = 0.5, 0.2, 10.0
    aggregator = _dice(c1, c2, batch)
    e0 = {k: torch.randn_like(p) for k, p in model.named_parameters()}
    aggregator.error = {k: v.clone() for k, v in e0.items()}
    released = aggregator.clipped_sum(
        model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=5, generator=_rng(0)
    )
    c_bar, g_bar = _reference_step(model, X, y, c1, batch)
    assert _norm(e0) > c2
    s = c2 / _norm(e0) * (1 - 2.0**-20)  # the documented safety shrink of the clip scale
    for k in e0:
        v = c_bar[k] + s * e0[k]  # noiseless direction
        assert torch.allclose(released[k] / batch, v, rtol=0, atol=1e-12)
        # T2: e + ḡ − v == (1 − s)e + (1/B)Σ(1 − α_i)g_i ; T4: the noise plays no part
        assert torch.allclose(aggregator.error[k], e0[k] + g_bar[k] - v, rtol=0, atol=1e-12)
        assert torch.allclose(aggregator.error[k], (1 - s) * e0[k] + (g_bar[k] - c_bar[k]), rtol=0, atol=1e-12)


def test_empty_batch_releases_the_clipped_error_and_keeps_the_rest() -> None:
    model = nn.Sequential(nn.Linear(2, 2)).double()
    aggregator = _dice(1.0, 0.5, 4.0)
    e0 = {k: torch.full_like(p, 3.0) for k, p in model.named_parameters()}
    aggregator.error = {k: v.clone() for k, v in e0.items()}
    released = aggregator.clipped_sum(
        model,
        torch.zeros(0, 2, dtype=torch.float64),
        torch.zeros(0, dtype=torch.int64),
        step=0,
        loss="cross_entropy",
        max_physical_batch_size=8,
        generator=_rng(0),
    )
    s = 0.5 / _norm(e0)
    for k in e0:
        assert torch.allclose(released[k] / 4.0, s * e0[k], rtol=1e-5)
        assert torch.allclose(aggregator.error[k], (1 - s) * e0[k], rtol=1e-5)


def test_sum_and_mean_scale_agree_because_b_is_the_public_constant() -> None:
    """T6: the released v uses the PUBLIC B; the realised batch size never enters."""
    model = nn.Sequential(nn.Linear(3, 2)).double()
    X, y = torch.randn(7, 3, dtype=torch.float64), torch.randint(0, 2, (7,))
    outs = []
    for batch in (7.0, 14.0):
        aggregator = _dice(1e6, 1.0, batch)
        released = aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=3, generator=_rng(0)
        )
        outs.append({k: v / batch for k, v in released.items()})
    for k in outs[0]:
        assert torch.allclose(outs[0][k], 2 * outs[1][k], atol=1e-12)


# ----------------------------------------------------------------------------- T3/T5


def test_telescoping_identity_with_constant_step_size() -> None:
    """T3 (σ = 0): x^T = x^0 − η·Σ_t ḡ(x^t) + η·e^T — catches order-of-operations bugs."""
    X, y = _toy_data([-1.0, -1.0, 2.0, 5.0])
    model = _scalar_model(0.3)
    xs = [_x(model)]
    hooks = TrainingHooks(on_step_end=lambda _: xs.append(_x(model)))
    aggregator = _dice(1.0, 0.3, 4.0)
    eta, steps = 0.05, 40
    _run_dice(model, X, y, aggregator, _config(steps=steps, q=1.0, batch=4.0, lr=eta), hooks=hooks)
    g_sum = sum(float(np.mean([2 * (x - xi) for xi in [-1, -1, 2, 5]])) for x in xs[:-1])
    e_T = float(aggregator.error["0.weight"].item())
    assert xs[-1] == pytest.approx(xs[0] - eta * g_sum + eta * e_T, abs=1e-12)


def test_c2_zero_follows_dpsgd_exactly_with_the_same_noise() -> None:
    """T5: C2 = 0 gives DPSGD-GC's trajectory (noise on, same generator stream and noise std)."""
    torch.manual_seed(1)
    X, y = torch.randn(40, 4, dtype=torch.float64) * 4, torch.randint(0, 3, (40,))
    base = nn.Sequential(nn.Linear(4, 3)).double()
    a, b = nn.Sequential(nn.Linear(4, 3)).double(), nn.Sequential(nn.Linear(4, 3)).double()
    a.load_state_dict(base.state_dict()), b.load_state_dict(base.state_dict())
    config = DPSGDConfig(
        steps=15,
        sampling_probability=0.25,
        noise_multiplier=0.7,
        clipping_norm=0.5,
        learning_rate=0.3,
        expected_batch_size=10.0,
    )
    aggregator = _dice(0.5, 0.0, 10.0)
    assert aggregator.sensitivity == 0.5
    _run_dice(a, X, y, aggregator, config, seed=3)
    _run_dpsgd(b, X, y, 0.5, config, seed=3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-12)


def test_unclipped_rows_leave_e_at_zero_and_equal_dpsgd() -> None:
    """T5: every per-sample norm ≤ C1 ⇒ e ≡ 0 and the run equals DPSGD-GC (σ = 0)."""
    torch.manual_seed(2)
    X, y = torch.randn(30, 4, dtype=torch.float64) * 0.1, torch.randint(0, 2, (30,))
    base = nn.Sequential(nn.Linear(4, 2)).double()
    a, b = nn.Sequential(nn.Linear(4, 2)).double(), nn.Sequential(nn.Linear(4, 2)).double()
    a.load_state_dict(base.state_dict()), b.load_state_dict(base.state_dict())
    config = DPSGDConfig(
        steps=10,
        sampling_probability=0.5,
        noise_multiplier=0.0,
        clipping_norm=100.0,
        learning_rate=0.1,
        expected_batch_size=15.0,
    )
    aggregator = _dice(100.0, 1.0, 15.0)
    _run_dice(a, X, y, aggregator, config, seed=4)
    _run_dpsgd(b, X, y, 100.0, config, seed=4)
    assert all(torch.equal(e, torch.zeros_like(e)) for e in aggregator.error.values())
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-12)


# ----------------------------------------------------------------------------- T7-T9: bias


def test_appendix_b1_example_dpsgd_is_biased_dicesgd_is_not() -> None:
    """T7, adapted to the service's squared loss (gradient 2(x − ξ) instead of a clamp).

    ξ = (−1, −1, 2), C = 1, full batch, σ = 0, η = 0.1, 400 steps. DPSGD-GC's fixed point solves
    2·clip(2(x+1), 1) + clip(2(x−2), 1) = 0 ⇒ 4(x+1) = 1 ⇒ x = −0.75; the optimum is the mean 0.
    DiceSGD (C1 = C2 = 1) reaches 0 and e → −(clipped mean at 0) = −1/3.
    """
    X, y = _toy_data([-1.0, -1.0, 2.0])
    config = _config(steps=400, q=1.0, batch=3.0, lr=0.1)
    dp, dice = _scalar_model(), _scalar_model()
    _run_dpsgd(dp, X, y, 1.0, config)
    aggregator = _dice(1.0, 1.0, 3.0)
    _run_dice(dice, X, y, aggregator, config)
    assert _x(dp) == pytest.approx(-0.75, abs=1e-8)
    assert abs(_x(dice)) < 1e-8
    assert float(aggregator.error["0.weight"].item()) == pytest.approx(-1 / 3, abs=1e-8)


def test_c2_below_the_bias_stalls_and_the_error_grows_linearly() -> None:
    """T8: C2 = 0.2 < bias 1/3. x stalls where the clipped mean is 0.2 (x = −0.6 here) and e
    grows by ḡ − v = −1.2 per step: nothing silently renormalises it."""
    X, y = _toy_data([-1.0, -1.0, 2.0])
    model = _scalar_model()
    errors: list[float] = []
    aggregator = _dice(1.0, 0.2, 3.0)
    hooks = TrainingHooks(on_step_end=lambda _: errors.append(float(aggregator.error["0.weight"].item())))
    _run_dice(model, X, y, aggregator, _config(steps=1000, q=1.0, batch=3.0, lr=0.1), hooks=hooks)
    assert _x(model) == pytest.approx(-0.6, abs=1e-6)
    assert errors[-1] - errors[-501] == pytest.approx(-1.2 * 500, rel=1e-6)


def _outlier_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, float]:
    """T9 in one dimension: 180 points ~ N(0, 0.3²), 20 outliers ~ N(8, 0.3²)."""
    rng = np.random.default_rng(seed)
    xi = np.concatenate([rng.normal(0.0, 0.3, 180), rng.normal(8.0, 0.3, 20)])
    X, y = _toy_data(xi.tolist())
    return X, y, float(xi.mean())


def test_outliers_full_batch_dicesgd_reaches_the_mean_dpsgd_does_not() -> None:
    X, y, mean = _outlier_data()
    config = _config(steps=500, q=1.0, batch=200.0, lr=0.05)
    dp, dice = _scalar_model(), _scalar_model()
    _run_dpsgd(dp, X, y, 1.0, config)
    _run_dice(dice, X, y, _dice(1.0, 1.0, 200.0), config)
    assert abs(_x(dice) - mean) < 1e-6
    assert abs(_x(dp) - mean) > 0.5


def test_outliers_minibatch_with_noise() -> None:
    """T9 second half: Poisson batches of expected size 20, σ1 = 0.05 on the average."""
    X, y, mean = _outlier_data()
    batch, sigma1 = 20.0, 0.05
    steps = 1500
    dice_agg = _dice(1.0, 1.0, batch)
    dice_sigma = sigma1 / (dice_agg.sensitivity / batch)  # σ = σ1/Δ
    dp, dice = _scalar_model(), _scalar_model()
    lr = 0.02
    _run_dpsgd(dp, X, y, 1.0, _config(steps=steps, q=0.1, batch=batch, lr=lr, sigma=sigma1 * batch / 1.0))
    # A fixed noise stream: the final iterate's noise is not negligible at this σ (about 1 stream in 8
    # ends ≥ 0.1 away), so the seed is one whose noise is typical.
    _run_dice(dice, X, y, dice_agg, _config(steps=steps, q=0.1, batch=batch, lr=lr, sigma=dice_sigma), seed=5)
    assert abs(_x(dice) - mean) < 0.1
    assert abs(_x(dp) - mean) > 0.5


# ----------------------------------------------------------------------------- T10/T11


def test_adam_variant_without_noise_or_clipping_is_torch_adam() -> None:
    torch.manual_seed(3)
    X, y = torch.randn(16, 3, dtype=torch.float64), torch.randint(0, 2, (16,))
    base = nn.Sequential(nn.Linear(3, 2)).double()
    a, b = nn.Sequential(nn.Linear(3, 2)).double(), nn.Sequential(nn.Linear(3, 2)).double()
    a.load_state_dict(base.state_dict()), b.load_state_dict(base.state_dict())
    config = DPSGDConfig(
        steps=12,
        sampling_probability=1.0,
        noise_multiplier=0.0,
        clipping_norm=1.0,
        learning_rate=0.01,
        optimizer="adam",
        expected_batch_size=16.0,
    )
    aggregator = _dice(1e6, 1e6, 16.0)
    _run_dice(a, X, y, aggregator, config)
    adam = torch.optim.Adam(b.parameters(), lr=0.01)
    for _ in range(12):
        adam.zero_grad()
        (nn.functional.cross_entropy(b(X), y, reduction="sum") / 16.0).backward()
        adam.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-10)
    assert all(float(e.abs().max()) < 1e-12 for e in aggregator.error.values())


def test_automatic_variant_has_no_nan_at_zero_error_and_reaches_the_mean() -> None:
    X, y, mean = _outlier_data()
    aggregator = ErrorFeedbackAggregator(
        per_sample_map=AutoSClip(clipping_norm=1.0, gamma=0.01),
        feedback_map=ErrorFeedbackNormalise(0.01),
        expected_batch_size=200.0,
    )
    assert aggregator.sensitivity == 1.0 + 2 * 200.0
    model = _scalar_model()
    _run_dice(model, X, y, aggregator, _config(steps=2000, q=1.0, batch=200.0, lr=0.01))
    assert math.isfinite(_x(model))
    assert abs(_x(model) - mean) < 0.02


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_restores_the_error_feedback_bit_for_bit(optimizer: str, tmp_path: Path) -> None:
    torch.manual_seed(5)
    X, y = torch.randn(60, 4) * 5, torch.randint(0, 3, (60,))
    base = nn.Sequential(nn.Linear(4, 3))
    config = DPSGDConfig(
        steps=9,
        sampling_probability=0.3,
        noise_multiplier=0.8,
        clipping_norm=1.0,
        learning_rate=0.2,
        optimizer=optimizer,
        expected_batch_size=18.0,
    )

    def fresh() -> nn.Module:
        m = nn.Sequential(nn.Linear(4, 3))
        m.load_state_dict(base.state_dict())
        return m

    straight = fresh()
    _run_dice(straight, X, y, _dice(0.2, 0.3, 18.0), config, seed=7)

    path = tmp_path / "ckpt.safetensors"
    saved: list[int] = []

    def save(state: TrainingState) -> None:
        save_training_state(path, state)
        saved.append(state.step)

    crashed = fresh()
    _run_dice(
        crashed,
        X,
        y,
        _dice(0.2, 0.3, 18.0),
        config,
        seed=7,
        hooks=TrainingHooks(save_checkpoint=save, checkpoint_every=4),
    )
    assert saved == [4, 8]
    state = load_training_state(path)
    keys = {k for entries in state.optimizer_state["state"].values() for k in entries}
    assert ERROR_FEEDBACK_CHECKPOINT_KEY in keys

    # resume from step 8's checkpoint on a fresh model and aggregator
    resumed = fresh()
    _run_dice(resumed, X, y, _dice(0.2, 0.3, 18.0), config, seed=99, resume_from=state)
    for pa, pb in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(pa, pb)

    # e is load-bearing: dropping it from the checkpoint changes the continuation
    state = load_training_state(path)
    for entries in state.optimizer_state["state"].values():
        entries.pop(ERROR_FEEDBACK_CHECKPOINT_KEY, None)
    without = fresh()
    _run_dice(without, X, y, _dice(0.2, 0.3, 18.0), config, seed=99, resume_from=state)
    assert any(not torch.equal(pa, pb) for pa, pb in zip(without.parameters(), straight.parameters(), strict=True))


def test_cancel_stops_before_a_step() -> None:
    X, y = _toy_data([0.0, 1.0])
    calls: list[int] = []
    hooks = TrainingHooks(on_step_end=calls.append, should_stop=lambda: len(calls) >= 3)
    result = _run_dice(
        _scalar_model(), X, y, _dice(1.0, 1.0, 2.0), _config(steps=10, q=1.0, batch=2.0, lr=0.1), hooks=hooks
    )
    assert result.stopped_early and result.steps_run == 3


# ----------------------------------------------------------------------------- P6: charged noise


N_ROWS, N_FEATURES = 2000, 600


@pytest.mark.parametrize("name", ["dicesgd", "dicesgd-adam", "dicesgd-auto"])
def test_trainer_sensitivity_equals_the_charged_one(name: str) -> None:
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[N_FEATURES], task="classification", n_classes=2)
    hyper = {"dicesgd": {"c1": 0.7, "c2": 0.05}, "dicesgd-adam": {"c1": 2.0, "c2": 0.5}, "dicesgd-auto": {}}[name]
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": 4.0},
            "training": {"steps": 3, "batch_size": 100, "learning_rate": 0.1},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    captured: list[float] = []
    original = ErrorFeedbackAggregator.clipped_sum

    def spy(self: ErrorFeedbackAggregator, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Forwards unchanged to the real method: only records the sensitivity it runs with."""
        captured.append(self.sensitivity)
        return original(self, *args, **kwargs)

    model = build_model("logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=_seeded(0))
    ErrorFeedbackAggregator.clipped_sum = spy  # type: ignore[method-assign]
    try:
        get_trainer(name)(_request(plan, model, torch.randn(N_ROWS, N_FEATURES), torch.randint(0, 2, (N_ROWS,)), name))
    finally:
        ErrorFeedbackAggregator.clipped_sum = original  # type: ignore[method-assign]
    assert captured and all(s == pytest.approx(plan.plan.sensitivity, rel=1e-12) for s in captured)


def _request(
    plan: JobPlan,
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    name: str,
    hooks: TrainingHooks | None = None,
) -> TrainingRequest:
    return TrainingRequest(
        model=model,
        features=TensorRows(X),
        y=y,
        task="classification",
        hyperparameters=plan.hyperparameters,
        training=plan.training,
        noise_multiplier=plan.noise_multiplier,
        sampling_probability=plan.plan.sampling_probability,
        expected_batch_size=plan.plan.expected_batch_size,
        steps=plan.plan.steps,
        max_physical_batch_size=128,
        generator=_rng(1),
        hooks=hooks or TrainingHooks(),
        resume_from=None,
        device=torch.device("cpu"),
    )


def test_dicesgd_trainer_draws_the_charged_noise_every_step(caplog: pytest.LogCaptureFixture) -> None:
    """Recover the noise of each step from the weight increments and compare with σ·Δ.

    Zero inputs make every weight gradient exactly 0, so the weight part of c̄, ḡ and e is 0
    (ψ scales e globally) and each step's weight increment is −η·w_t with w_t ~ N(0, (σ·Δ)² I)
    on the averaged scale, Δ = C1/B + 2·C2 — the charged GaussianEvent's σ times its sensitivity.
    """
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[N_FEATURES], task="classification", n_classes=2)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": "dicesgd", "hyperparameters": {"c1": 0.7, "c2": 0.01}},
            "privacy": {"target_epsilon": 8.0},
            "training": {"steps": 10, "batch_size": 100, "learning_rate": 0.5},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    event = privacy.event_from_json(plan.event_json)
    assert event == privacy.GaussianEvent(noise_multiplier=plan.noise_multiplier, count=10)
    delta_avg = 0.7 / 100 + 2 * 0.01
    assert plan.plan.sensitivity == pytest.approx(100 * delta_avg)

    model = build_model("logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=_seeded(0))
    weights = [model[-1].weight.detach().clone()]
    hooks = TrainingHooks(on_step_end=lambda _: weights.append(model[-1].weight.detach().clone()))
    X, y = torch.zeros(N_ROWS, N_FEATURES), torch.randint(0, 2, (N_ROWS,))
    with caplog.at_level(logging.DEBUG):
        result = get_trainer("dicesgd")(_request(plan, model, X, y, "dicesgd", hooks))
    assert result.steps_run == 10
    assert not caplog.records  # nothing at all is logged by a normal run
    increments = torch.stack([(b - a).flatten() for a, b in itertools.pairwise(weights)]).double()
    noise = (-increments / 0.5).numpy()  # (T, d): the noise of each step on the averaged scale
    expected_std = plan.noise_multiplier * delta_avg
    for per_step in noise:  # every step draws fresh noise at the charged scale
        assert float(per_step.std()) == pytest.approx(expected_std, rel=0.1)
    statistic = float(np.sum((noise / expected_std) ** 2))
    p_value = 2 * min(stats.chi2.cdf(statistic, noise.size), stats.chi2.sf(statistic, noise.size))
    assert p_value > 1e-3
    correlation = np.corrcoef(noise[:-1].ravel(), noise[1:].ravel())[0, 1]
    assert abs(correlation) < 4 / math.sqrt(noise[1:].size)  # never reused across steps


# ----------------------------------------------------------------------------- engines


def test_ghost_and_vmap_engines_give_the_same_step() -> None:
    """Ghost (two book-keeping passes) and vmap (one 2×m contraction) agree on v and e."""
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).double()
    X, y = torch.randn(20, 6, dtype=torch.float64) * 4, torch.randint(0, 3, (20,))
    X[3] = float("inf")  # a row with a non-finite gradient: weight 0 in both sums, both engines
    e0 = {k: torch.randn_like(p) * 0.1 for k, p in model.named_parameters()}
    outs = []
    for engine in ("ghost", "vmap"):
        aggregator = ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(0.3), feedback_map=ErrorFeedbackClip(0.5), expected_batch_size=16.0, engine=engine
        )
        aggregator.error = {k: v.clone() for k, v in e0.items()}
        released = aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=7, generator=_rng(0)
        )
        outs.append((released, aggregator.error))
    for k in e0:
        assert torch.isfinite(outs[0][0][k]).all() and torch.isfinite(outs[0][1][k]).all()
        assert torch.allclose(outs[0][0][k], outs[1][0][k], rtol=1e-9, atol=1e-10)
        assert torch.allclose(outs[0][1][k], outs[1][1][k], rtol=1e-9, atol=1e-10)
    assert any(float(e.abs().max()) > 0.2 for e in outs[0][1].values())  # clipping happened


def test_one_book_keeping_pass_equals_separate_ghost_sums() -> None:
    """ghost_weighted_grad_sums (added for DiceSGD) == ghost_clipped_grad_sum once per map."""
    from algorithms.dicesgd.aggregator import _Residual
    from dp.per_example.ghost import ghost_clipped_grad_sum, ghost_weighted_grad_sums

    model = build_model("cnn2-gn", {}, input_shape=(1, 14, 14), n_outputs=3, generator=_seeded(0)).double()
    X = torch.randn(9, 1, 14, 14, dtype=torch.float64, generator=_seeded(1)) * 3
    y = torch.randint(0, 3, (9,), generator=_seeded(2))
    X[4] = float("nan")
    maps = (AbadiClip(0.5), _Residual(AbadiClip(0.5)))
    together = ghost_weighted_grad_sums(
        model, X, y, loss="cross_entropy", per_sample_maps=maps, max_physical_batch_size=4
    )
    for per_sample_map, result in zip(maps, together, strict=True):
        alone = ghost_clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=per_sample_map, max_physical_batch_size=4
        )
        for name in alone:
            assert torch.isfinite(result[name]).all()
            assert torch.allclose(result[name], alone[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "params", "shape"),
    [
        ("transformer-lm", {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 13, "pad_id": 0}, (6,)),
        ("wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, (3, 8, 8)),
    ],
)
def test_one_pass_equals_separate_sums_on_embeddings_sequences_and_standardised_convs(
    name: str, params: dict, shape: tuple[int, ...]
) -> None:
    """Every rule's accumulate takes all weightings at once (Embedding, LayerNorm, Linear on
    sequences in both forms, weight-standardised convs): each equals its own ghost pass."""
    from algorithms.dicesgd.aggregator import _Residual
    from dp.per_example.ghost import ghost_clipped_grad_sum, ghost_weighted_grad_sums

    text = name == "transformer-lm"
    n_outputs = 13 if text else 3
    model = build_model(name, params, input_shape=shape, n_outputs=n_outputs, generator=_seeded(0)).double()
    if text:
        X = torch.randint(1, 13, (9, *shape), generator=_seeded(1))
        y, loss = X.clone(), "token_cross_entropy_sum"
    else:
        X = torch.randn(9, *shape, dtype=torch.float64, generator=_seeded(1)) * 3
        y, loss = torch.randint(0, 3, (9,), generator=_seeded(2)), "cross_entropy"
    maps = (AbadiClip(0.05), _Residual(AbadiClip(0.05)), AbadiClip(1e9))
    together = ghost_weighted_grad_sums(model, X, y, loss=loss, per_sample_maps=maps, max_physical_batch_size=4)
    for per_sample_map, result in zip(maps, together, strict=True):
        alone = ghost_clipped_grad_sum(model, X, y, loss=loss, per_sample_map=per_sample_map, max_physical_batch_size=4)
        for key in alone:
            assert torch.allclose(result[key], alone[key], rtol=1e-12, atol=1e-12), key
    assert any(float(t.abs().max()) > 0 for t in together[1].values())  # rows were clipped: a residual
