"""The DP-SGD-family baselines dp-adam, auto-s and dp-psac on the worker side.

- Per-sample maps: the norm bound S = C holds for random and adversarial gradients, Auto-S tends
  to normalisation as γ → 0, PSAC is the Xia et al. formula, zero gradients map to zero.
- Noise conformance: plan a job with the API's own code (σ, q, T, event, S), run the registered
  trainer on data whose weight gradients are exactly zero, and compare the noise with σ·S/B.
  How the noise is observed: a global optimizer step pre-hook
  (`torch.optim.optimizer.register_optimizer_step_pre_hook`, public PyTorch API) records every
  trainable parameter's `.grad` just before each `optimizer.step()`. The loop sets `.grad` to the
  privatised gradient (Σ ḡ_i + noise)/B, and the weight part of Σ ḡ_i is exactly zero, so the
  recorded weight gradients ARE noise/B — whatever the optimizer then does with them (Adam's update
  is not linear in the gradient). For the SGD variants the noise is also recovered independently
  from the parameter change Δw = −lr·Σ_t noise_t/B, as in test_worker_charged_noise.py.
- Learning: each trainer, as registered, reaches > 0.8 test accuracy on sklearn digits at σ = 1.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from algorithms import get_algorithm
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum, per_sample_norms
from dp.per_example.per_sample_maps import (
    PER_SAMPLE_MAPS,
    AutoSClip,
    PSACClip,
    build_per_sample_map,
)
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import JobPlan, plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

MAPS = {"auto-s": lambda c: AutoSClip(c, gamma=0.01), "psac": lambda c: PSACClip(c, r=0.01)}


def _exact_mapped_norm(name: str, c: float, u: float, smoothing: float) -> Fraction:
    """||ḡ|| in exact rational arithmetic for a gradient of norm u (the float values, exactly)."""
    C, U, s = Fraction(c), Fraction(u), Fraction(smoothing)
    if name == "auto-s":
        return C * U / (U + s)
    return C * U / (U + s / (U + s))


# ----------------------------------------------------------------------------- per-sample maps


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["auto-s", "psac"]),
    c=st.floats(min_value=1e-3, max_value=1e4),
    smoothing=st.floats(min_value=1e-6, max_value=1e4),
    u=st.one_of(
        st.just(0.0),
        st.floats(min_value=0.0, max_value=1e-300),  # subnormal / tiny
        st.floats(min_value=0.0, max_value=1e300),
        st.floats(min_value=1e250, max_value=1e300),  # huge
    ),
)
def test_mapped_norm_is_strictly_below_c_exactly(name: str, c: float, smoothing: float, u: float) -> None:
    """The formulas themselves: ||ḡ|| < C for every norm u ≥ 0 (exact arithmetic, no rounding)."""
    assert _exact_mapped_norm(name, c, u, smoothing) < Fraction(c)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(["auto-s", "psac"]),
    c=st.floats(min_value=1e-3, max_value=1e4),
    smoothing=st.floats(min_value=1e-6, max_value=10.0),
    log10_norm=st.floats(min_value=-300, max_value=150),
    dim=st.integers(min_value=1, max_value=50),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_implemented_maps_respect_the_bound(
    name: str, c: float, smoothing: float, log10_norm: float, dim: int, seed: int
) -> None:
    """The implementation on float64 gradient vectors with norms from 1e-300 to 1e150: ||ḡ|| ≤ C up
    to one rounding, and strictly < C wherever the exact gap C − ||ḡ|| is above rounding."""
    per_sample_map = AutoSClip(c, gamma=smoothing) if name == "auto-s" else PSACClip(c, r=smoothing)
    g = torch.randn(3, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # norms up to 1e150: beyond ~1e154 the float64 norm overflows to inf, and clipped_grad_sum
    # maps such rows to zero before any scale is applied (covered by the float32 test below)
    g = g / g.norm(dim=1, keepdim=True) * torch.tensor([[10.0**log10_norm], [1e-300], [1e150]], dtype=torch.float64)
    norms = per_sample_norms({"w": g})
    scale = per_sample_map.scale_factors(norms)
    assert bool(torch.isfinite(scale).all())
    mapped = (scale[:, None] * g).norm(dim=1)
    for u, out in zip(norms.tolist(), mapped.tolist(), strict=True):
        assert out <= c * (1 + 1e-12)
        gap = Fraction(c) - _exact_mapped_norm(name, c, u, smoothing)
        if gap > Fraction(c) * Fraction(1, 10**9):
            assert out < c


@pytest.mark.parametrize("name", ["auto-s", "psac"])
@settings(max_examples=60, deadline=None)
@given(
    log10_scale=st.floats(min_value=-40, max_value=40),
    c=st.sampled_from([0.01, 1.0, 37.0, 1e4]),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
)
def test_clipped_sum_of_one_row_is_below_c_in_float32(name: str, log10_scale: float, c: float, seed: int) -> None:
    """The real path (float32 per-sample gradients, their norm, the scale, the sum) for one row of
    a logistic regression whose input is scaled from 1e-40 (underflow) to 1e40 (overflow)."""
    gen = torch.Generator().manual_seed(seed)
    model = build_model("logistic-regression", {}, input_shape=(20,), n_outputs=3, generator=gen)
    per_sample_map = AutoSClip(c, gamma=0.01) if name == "auto-s" else PSACClip(c, r=0.01)
    X = torch.randn(1, 20, generator=gen) * 10.0**log10_scale
    y = torch.randint(0, 3, (1,), generator=gen)
    total = clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=per_sample_map, max_physical_batch_size=8
    )
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in total.values()))
    assert math.isfinite(norm)
    assert norm <= c * (1 + 1e-5)  # float32 rounding of the norm and of the products only


@pytest.mark.parametrize("name", ["auto-s", "psac"])
def test_zero_gradients_map_to_zero(name: str) -> None:
    per_sample_map = MAPS[name](2.0)
    scale = per_sample_map.scale_factors(torch.zeros(4))
    assert bool(torch.isfinite(scale).all())
    model = nn.Sequential(nn.Linear(6, 3, bias=False))
    X = torch.zeros(5, 6)  # no bias: every per-sample gradient is exactly zero
    y = torch.tensor([0, 1, 2, 0, 1])
    total = clipped_grad_sum(
        model, X, y, loss="cross_entropy", per_sample_map=per_sample_map, max_physical_batch_size=2
    )
    assert all(bool((t == 0).all()) for t in total.values())


def test_auto_s_tends_to_normalisation_as_gamma_goes_to_zero() -> None:
    c = 1.5
    g = torch.randn(64, 30, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    g = g * torch.logspace(-1, 1, 64, dtype=torch.float64)[:, None]  # norms ≈ 0.5 .. 55
    norms = per_sample_norms({"w": g})
    normalised = c * g / norms[:, None]
    errors = []
    for gamma in (1e-2, 1e-4, 1e-6, 1e-9, 1e-12):
        mapped = AutoSClip(c, gamma=gamma).scale_factors(norms)[:, None] * g
        error = float((mapped - normalised).norm(dim=1).max())
        assert error <= c * gamma / float(norms.min()) * (1 + 1e-6) + 1e-13
        errors.append(error)
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 1e-10
    # and γ > 0 is not normalisation: a norm-u gradient has norm C·u/(u + γ) < C
    assert AutoSClip(c, gamma=0.5).scale_factors(torch.tensor([0.5])).item() * 0.5 == pytest.approx(c / 2)


@pytest.mark.parametrize(
    ("c", "r", "u", "expected_scale"),
    [
        # scale = C / (u + r/(u + r)), computed by hand as fractions
        (1.0, 0.01, 0.0, 1.0),  # 1 / (0 + 1)
        (1.0, 0.01, 0.01, 100 / 51),  # 1 / (0.01 + 0.5)
        (1.0, 0.01, 0.09, 100 / 19),  # 1 / (0.09 + 0.1): the maximum, at u = √r − r
        (1.0, 0.01, 0.1, 110 / 21),  # 1 / (0.1 + 1/11)
        (1.0, 0.01, 1.0, 101 / 102),  # 1 / (1 + 1/101)
        (2.0, 1.0, 1.0, 4 / 3),  # 2 / (1 + 1/2)
        (3.0, 0.25, 0.25, 4.0),  # 3 / (0.25 + 0.5)
        (1.0, 0.01, 99.99, 100 / 9999.01),  # 1 / (99.99 + 0.0001)
    ],
)
def test_psac_matches_the_xia_formula_at_hand_computed_points(
    c: float, r: float, u: float, expected_scale: float
) -> None:
    scale = PSACClip(c, r=r).scale_factors(torch.tensor([u], dtype=torch.float64)).item()
    assert scale == pytest.approx(expected_scale, rel=1e-12)


def test_psac_is_the_xia_form_not_opacus_variant() -> None:
    """Opacus' PSACDPOptimizer scales by min(1, C(u+r)/(u(u²+ru+r))); at u = 0.1, r = 0.01 that is
    1, whereas Xia's weight is 110/21 — small gradients are scaled up, non-monotonically."""
    psac = PSACClip(1.0, r=0.01)
    scales = psac.scale_factors(torch.tensor([0.0, 0.09, 0.1, 1.0], dtype=torch.float64)).tolist()
    assert scales[2] == pytest.approx(110 / 21) and scales[2] != pytest.approx(1.0)
    assert scales[1] > scales[0] and scales[1] > scales[3]  # non-monotone: peak at u = √r − r


@pytest.mark.parametrize(
    "make",
    [
        lambda: AutoSClip(1.0, gamma=0.0),
        lambda: AutoSClip(1.0, gamma=-0.1),
        lambda: AutoSClip(1.0, gamma=float("nan")),
        lambda: AutoSClip(float("inf"), gamma=0.01),
        lambda: AutoSClip(1e300, gamma=1e-300),  # C/γ overflows
        lambda: PSACClip(1.0, r=0.0),
        lambda: PSACClip(0.0, r=0.01),
        lambda: PSACClip(1.0, r=float("inf")),
    ],
)
def test_invalid_map_parameters_are_refused(make) -> None:  # noqa: ANN001
    with pytest.raises(ValueError):
        make()


def test_maps_are_registered_by_name() -> None:
    assert {"abadi", "auto-s", "psac"} <= set(PER_SAMPLE_MAPS.names())
    assert build_per_sample_map("auto-s", clipping_norm=2.0, gamma=0.1) == AutoSClip(2.0, gamma=0.1)
    assert build_per_sample_map("psac", clipping_norm=2.0) == PSACClip(2.0, r=0.01)
    assert build_per_sample_map("abadi", clipping_norm=2.0) == AbadiClip(2.0)
    for per_sample_map in (AutoSClip(2.0), PSACClip(2.0)):
        assert per_sample_map.norm_bound == 2.0


# ----------------------------------------------------------------------------- noise conformance

N_ROWS, N_FEATURES = 2000, 1500
CLIP = 0.7  # ≠ 1, so a worker using the wrong S (1, or C²) is caught
LR = 0.5

CASES = [
    ("dp-adam", {"clipping_norm": CLIP, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6}),
    ("auto-s", {"clipping_norm": CLIP, "gamma": 0.05}),
    ("auto-s", {"clipping_norm": CLIP, "optimizer": "adam"}),
    ("dp-psac", {"clipping_norm": CLIP, "r": 0.02}),
    ("dp-psac", {"clipping_norm": CLIP, "optimizer": "adam"}),
]
CASE_IDS = ["dp-adam", "auto-s-sgd", "auto-s-adam", "dp-psac-sgd", "dp-psac-adam"]


def _plan(name: str, hyperparameters: dict, evaluation: dict | None = None, **training) -> JobPlan:  # noqa: ANN003
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[N_FEATURES], task="classification", n_classes=2)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyperparameters},
            "privacy": {"target_epsilon": 2.0},
            "training": training or {"steps": 20, "batch_size": 100, "learning_rate": LR},
            "evaluation": evaluation,
        }
    )
    return plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)


def _request(plan: JobPlan, model: nn.Module, X: torch.Tensor, y: torch.Tensor, seed: int = 1) -> TrainingRequest:
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
        max_physical_batch_size=64,
        generator=SecureRandom.from_seed(seed),
        hooks=TrainingHooks(),
        resume_from=None,
        device=torch.device("cpu"),
    )


def _assert_noise(samples: np.ndarray, expected_std: float) -> None:
    """Std within ±5% (several standard errors), a two-sided χ² variance test, mean ≈ 0."""
    assert float(samples.std()) == pytest.approx(expected_std, rel=0.05)
    statistic = float(np.sum((samples / expected_std) ** 2))
    p_value = 2 * min(stats.chi2.cdf(statistic, samples.size), stats.chi2.sf(statistic, samples.size))
    assert p_value > 1e-3, p_value
    assert abs(float(samples.mean())) < 4 * expected_std / math.sqrt(samples.size)


@pytest.mark.parametrize(
    "evaluation",
    [None, {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.2}],
    ids=["all-rows", "with-holdout"],
)
@pytest.mark.parametrize(("name", "hyperparameters"), CASES, ids=CASE_IDS)
def test_baseline_trainer_draws_the_charged_noise(name: str, hyperparameters: dict, evaluation: dict | None) -> None:
    plan = _plan(name, hyperparameters, evaluation)
    event = privacy.event_from_json(plan.event_json)
    if evaluation is not None:
        assert isinstance(event, privacy.ComposedEvent)
        event = event.events[0]
    assert event == privacy.PoissonSampledGaussianEvent(
        sampling_probability=plan.plan.sampling_probability,
        noise_multiplier=plan.noise_multiplier,
        count=20,
    )
    assert plan.plan.sensitivity == CLIP  # S = C for every map here
    assert plan.plan.expected_batch_size == 100

    model = build_model(
        "logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=torch.Generator().manual_seed(0)
    )
    weight = model[-1].weight
    before = weight.detach().clone()
    # All n rows are passed even with a hold-out: q = B/(0.75·n) then makes q·len(X) ≈ 133 ≠ B,
    # so a trainer that normalised by q·len(X) instead of the public B would fail here.
    X = torch.zeros(N_ROWS, N_FEATURES)  # zero inputs: every weight gradient is exactly zero
    y = torch.randint(0, 2, (N_ROWS,), generator=torch.Generator().manual_seed(2))

    seen: list[torch.optim.Optimizer] = []
    weight_grads: list[torch.Tensor] = []

    def record(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        seen.append(optimizer)
        weight_grads.append(weight.grad.detach().clone())

    handle = register_optimizer_step_pre_hook(record)
    try:
        result = get_trainer(name)(_request(plan, model, X, y))
    finally:
        handle.remove()
    assert result.steps_run == 20 and len(weight_grads) == 20

    # the optimizer really is the one the spec names, with its hyperparameters
    optimizer = seen[0]
    assert all(o is optimizer for o in seen)
    group = optimizer.param_groups[0]
    hyper = plan.spec["algorithm"]["hyperparameters"]
    if name == "dp-adam" or hyper.get("optimizer") == "adam":
        assert type(optimizer) is torch.optim.Adam
        if name == "dp-adam":
            assert group["betas"] == (0.8, 0.99) and group["eps"] == 1e-6
    else:
        assert type(optimizer) is torch.optim.SGD
        assert group["momentum"] == hyper["momentum"] == 0.0

    # the gradient handed to the optimizer: noise/B, each coordinate N(0, (σ·S/B)²)
    expected_std = plan.noise_std_on_sum / plan.plan.expected_batch_size
    assert plan.noise_std_on_sum == plan.noise_multiplier * CLIP
    _assert_noise(torch.stack(weight_grads).double().flatten().numpy(), expected_std)
    # the 20 draws are independent: no repeated noise vector
    assert len({float(g[0, 0]) for g in weight_grads}) == 20

    if type(optimizer) is torch.optim.SGD:  # independently, from the parameter change
        change = (weight.detach() - before).double().flatten().numpy()
        _assert_noise(change, LR * math.sqrt(20) * expected_std)


# ----------------------------------------------------------------------------- learning

LEARNING_CASES = [
    ("dp-adam", {"clipping_norm": 1.0}, 0.05),
    ("auto-s", {"clipping_norm": 1.0, "momentum": 0.5}, 1.0),
    ("auto-s", {"clipping_norm": 1.0, "optimizer": "adam"}, 0.05),
    ("dp-psac", {"clipping_norm": 1.0, "momentum": 0.5}, 1.0),
    ("dp-psac", {"clipping_norm": 1.0, "optimizer": "adam"}, 0.05),
]


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return (
        torch.tensor(scaler.transform(X_train), dtype=torch.float32),
        torch.tensor(y_train),
        torch.tensor(scaler.transform(X_test), dtype=torch.float32),
        torch.tensor(y_test),
    )


@pytest.mark.parametrize(
    ("name", "hyperparameters", "learning_rate"),
    LEARNING_CASES,
    ids=["dp-adam", "auto-s-sgd", "auto-s-adam", "dp-psac-sgd", "dp-psac-adam"],
)
def test_baseline_learns_digits(name: str, hyperparameters: dict, learning_rate: float, digits) -> None:  # noqa: ANN001
    X_train, y_train, X_test, y_test = digits
    dataset = Dataset(n_rows=X_train.shape[0], feature_shape=[64], task="classification", n_classes=10)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_digits",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyperparameters},
            "privacy": {"noise_multiplier": 1.0},
            "training": {"steps": 300, "batch_size": 64, "learning_rate": learning_rate},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    assert plan.noise_multiplier == 1.0 and plan.plan.steps == 300
    model = build_model(
        "logistic-regression", {}, input_shape=(64,), n_outputs=10, generator=torch.Generator().manual_seed(0)
    )
    result = get_trainer(name)(_request(plan, model, X_train, y_train))
    assert result.steps_run == 300
    model.eval()
    with torch.no_grad():
        accuracy = (model(X_test).argmax(dim=1) == y_test).float().mean().item()
    assert accuracy > 0.8, accuracy


def test_trainer_refuses_a_map_whose_bound_differs_from_the_charge(monkeypatch) -> None:  # noqa: ANN001
    """The guard that ties the worker's S to the catalogue's sensitivity."""
    plan = _plan("auto-s", {"clipping_norm": CLIP})
    definition = get_algorithm("auto-s")
    monkeypatch.setattr(type(definition), "sensitivity", lambda self, hyper: 2 * CLIP)
    model = build_model(
        "logistic-regression", {}, input_shape=(N_FEATURES,), n_outputs=2, generator=torch.Generator().manual_seed(0)
    )
    X, y = torch.zeros(10, N_FEATURES), torch.zeros(10, dtype=torch.long)
    with pytest.raises(RuntimeError, match="charged sensitivity"):
        get_trainer("auto-s")(_request(plan, model, X, y))
