"""DC-DPSGD's catalogue entries: hyperparameters, sensitivity, the charged event (T13-T17).

Hand-checkable values (docs/algorithms/dc-dpsgd.md#rank-rule-sensitivity): Δ = 2·c1 − c2 = 1.9
(rank) vs c1 = 1 (threshold)
for c1 = 1, c2 = 0.1; σ_eff = 1/√2 for σ = σ_b = 1; the trace noise σ_tr never changes ε; the
event is DP-SGD's subsampled Gaussian at the full ε, so the accountant anchors carry over.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from algorithms import InvalidHyperparameters, PrivacyPlan, get_algorithm
from algorithms.dc_dpsgd.definition import (
    PAPER_CLAIM_LABEL,
    DCDPSGDHyperparameters,
    DCDPSGDThresholdHyperparameters,
    effective_noise_multiplier,
    paper_claimed_epsilon,
)
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.db.orm import Dataset
from kernel.jobs.planning import JobPlan, plan_job
from kernel.schemas.jobs import JobCreate, TrainingSpec

RANK, THRESHOLD = "dc-dpsgd", "dc-dpsgd-threshold"
FACTS = DatasetFacts(n_rows=10_000, feature_shape=(10,), task="classification", n_classes=2)
DELTA = 1e-5


def _plan(
    name: str, hyper: dict, *, steps: int = 100, batch_size: int = 100, facts: DatasetFacts = FACTS
) -> PrivacyPlan:
    algorithm = get_algorithm(name)
    training = TrainingSpec(steps=steps, batch_size=batch_size, learning_rate=0.1)
    return algorithm.plan(algorithm.validate_hyperparameters(hyper), training, facts)


def _job(name: str, hyper: dict, privacy_spec: dict, *, n_rows: int = 10_000) -> JobPlan:
    dataset = Dataset(n_rows=n_rows, feature_shape=[10], task="classification", n_classes=2)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": privacy_spec,
            "training": {"steps": 100, "batch_size": 100, "learning_rate": 0.5},
        }
    )
    return plan_job(spec, dataset, dataset_delta=DELTA, max_steps=10_000)


# ----------------------------------------------------------------------------- hyperparameters


def test_both_entries_are_registered_and_describe_themselves() -> None:
    for name in (RANK, THRESHOLD):
        description = get_algorithm(name).describe()
        assert description["name"] == name and description["family"] == "dc-dpsgd"
        defaults = description["defaults"]
        assert defaults["c2"] == 0.1 and defaults["c1"] == pytest.approx(1.0)  # c1 = 10·c2
        assert defaults["k"] == 200 and defaults["theta"] == 2.0 and defaults["p"] == 0.1
        assert defaults["sigma_tr"] == 0.0 and defaults["scope"] == "all"
        assert defaults["optimizer"] == "sgd"
        assert "hyperparameters_schema" in description
    threshold = get_algorithm(THRESHOLD).describe()["defaults"]
    assert threshold["tracking"] is False and threshold["tau"] is None
    assert threshold["threshold_noise_ratio"] == 10.0 and threshold["eta_tau"] == 0.2


def test_c1_defaults_to_ten_times_c2_and_normalisation_is_idempotent() -> None:
    for model in (DCDPSGDHyperparameters, DCDPSGDThresholdHyperparameters):
        parsed = model.model_validate({"c2": 0.05})
        assert parsed.c1 == pytest.approx(0.5)
        assert model.model_validate({"c2": 0.05, "c1": 0.07}).c1 == 0.07
        dumped = parsed.model_dump(mode="json")
        assert dumped["c1"] == pytest.approx(0.5)  # stored concretely: the worker re-validates it
        assert model.model_validate(dumped) == parsed
    scoped = DCDPSGDHyperparameters.model_validate({"scope": ["1.weight"], "k": 20})
    assert DCDPSGDHyperparameters.model_validate(scoped.model_dump(mode="json")) == scoped


@pytest.mark.parametrize(
    ("name", "hyper"),
    [
        (RANK, {"c2": 0.5, "c1": 0.4}),  # c1 < c2
        (RANK, {"c2": 0.0}),
        (RANK, {"c2": float("nan")}),
        (RANK, {"c1": float("inf")}),
        (RANK, {"p": 0.0}),
        (RANK, {"p": 1.0}),
        (RANK, {"k": 0}),
        (RANK, {"theta": 0.0}),
        (RANK, {"sigma_tr": -1.0}),
        (RANK, {"scope": []}),
        (RANK, {"scope": ["a", "a"]}),
        (RANK, {"scope": "first"}),
        (RANK, {"optimizer": "rmsprop"}),
        (RANK, {"optimizer": "adam", "momentum": 0.9}),
        (RANK, {"momentum": 1.0}),
        (RANK, {"tau": 0.1}),  # threshold-only field
        (RANK, {"epsilon_tr": 4.0}),  # the paper's split is not a knob
        (THRESHOLD, {"tau": 0.0}),
        (THRESHOLD, {"tracking": True, "threshold_noise_ratio": 0.0}),
        (THRESHOLD, {"eta_tau": -0.1}),
        (THRESHOLD, {"clipping_norm": 1.0}),
    ],
)
def test_invalid_hyperparameters_are_refused(name: str, hyper: dict) -> None:
    with pytest.raises(InvalidHyperparameters):
        get_algorithm(name).validate_hyperparameters(hyper)


def test_the_catalogue_is_torch_free() -> None:
    code = (
        "import sys; import algorithms.dc_dpsgd.definition, kernel.jobs.planning; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- T15 Δ plumbing


def test_sensitivity_rank_is_2c1_minus_c2_and_threshold_is_c1() -> None:
    assert _plan(RANK, {"c1": 1.0, "c2": 0.1}).sensitivity == pytest.approx(1.9)
    assert _plan(THRESHOLD, {"c1": 1.0, "c2": 0.1}).sensitivity == pytest.approx(1.0)
    assert _plan(THRESHOLD, {"c1": 1.0, "c2": 0.1, "tracking": True}).sensitivity == pytest.approx(1.0)


def test_noise_std_on_the_sum_for_sigma_one() -> None:
    """T15: c1 = 1, c2 = 0.1, σ = 1 → noise std 1.0 (threshold) and 1.9 (rank)."""
    rank = _job(RANK, {"c1": 1.0, "c2": 0.1}, {"noise_multiplier": 1.0})
    threshold = _job(THRESHOLD, {"c1": 1.0, "c2": 0.1}, {"noise_multiplier": 1.0})
    assert rank.noise_std_on_sum == pytest.approx(1.9)
    assert threshold.noise_std_on_sum == pytest.approx(1.0)
    # Same σ, same (q, T): the same event and the same ε — the extra noise of rank is Δ's.
    assert rank.event_json == threshold.event_json
    assert rank.epsilon_ledger == threshold.epsilon_ledger


@pytest.mark.parametrize("name", [RANK, THRESHOLD])
def test_doubling_both_clips_doubles_the_noise_and_keeps_epsilon(name: str) -> None:
    small = _job(name, {"c1": 1.0, "c2": 0.1}, {"target_epsilon": 2.0})
    large = _job(name, {"c1": 2.0, "c2": 0.2}, {"target_epsilon": 2.0})
    assert large.noise_multiplier == small.noise_multiplier
    assert large.noise_std_on_sum == pytest.approx(2 * small.noise_std_on_sum)
    assert large.epsilon_ledger == small.epsilon_ledger <= 2.0


def test_the_event_is_dp_sgds_subsampled_gaussian_at_the_full_budget() -> None:
    """No ε_tr/ε_dp split: the gradient Gaussian gets the whole target."""
    dp_sgd = _job("dp-sgd", {"clipping_norm": 1.0}, {"target_epsilon": 3.0})
    for name in (RANK, THRESHOLD):
        dc = _job(name, {}, {"target_epsilon": 3.0})
        assert dc.noise_multiplier == dp_sgd.noise_multiplier
        assert dc.event_json == dp_sgd.event_json
        event = privacy.event_from_json(dc.event_json)
        assert event == privacy.PoissonSampledGaussianEvent(0.01, dc.noise_multiplier, 100)


def test_normalised_spec_replans_to_the_charged_event() -> None:
    """What the worker's replan does: re-validate the stored spec and rebuild the event."""
    for name, hyper in ((RANK, {"c2": 0.2}), (THRESHOLD, {"c2": 0.2, "tracking": True, "threshold_noise_ratio": 2.0})):
        job = _job(name, hyper, {"target_epsilon": 1.5})
        stored = job.spec["algorithm"]["hyperparameters"]
        assert stored["c1"] == pytest.approx(2.0)
        algorithm = get_algorithm(name)
        plan = algorithm.plan(
            algorithm.validate_hyperparameters(stored), TrainingSpec.model_validate(job.spec["training"]), FACTS
        )
        assert privacy.event_to_json(plan.event(job.noise_multiplier)) == job.event_json


# ----------------------------------------------------------------------------- T13 / T14 anchors


def test_closed_form_gaussian_anchor_without_subsampling() -> None:
    """T13: q = 1, σ = 10, T = 100 is μ = 1 GDP: ε(δ = 1e-5) = 4.3772 (PRV within its error)."""
    for name in (RANK, THRESHOLD):
        plan = _plan(name, {}, steps=100, batch_size=FACTS.n_rows)
        event = plan.event(10.0)
        assert event == privacy.GaussianEvent(10.0, 100)
        eps = privacy.prv_epsilon(event, DELTA)
        assert eps is not None and 4.3772 - 1e-3 <= eps <= 4.3772 + 0.02
        assert eps <= privacy.epsilon_from_rdp(privacy.rdp_curve(event), DELTA)[0]


def test_subsampled_anchor() -> None:
    """T14: q = 0.01, σ = 1, T = 1000 → ε_PLD = 1.8282, ε_RDP ≈ 2.1014 (δ = 1e-5)."""
    event = _plan(RANK, {"c1": 3.0, "c2": 0.3}, steps=1000, batch_size=100).event(1.0)
    assert event == privacy.PoissonSampledGaussianEvent(0.01, 1.0, 1000)
    eps_prv = privacy.prv_epsilon(event, DELTA)
    eps_rdp = privacy.epsilon_from_rdp(privacy.rdp_curve(event), DELTA)[0]
    assert eps_prv == pytest.approx(1.8282, rel=0.02)
    assert 2.1014 <= eps_rdp <= 2.1014 * 1.03
    assert eps_prv <= eps_rdp


# ----------------------------------------------------------------------------- T16 joint release


def test_effective_noise_multiplier_of_the_tracked_threshold() -> None:
    """T16: σ_eff = (σ⁻² + σ_b⁻²)^(-1/2); σ = σ_b = 1 → 1/√2."""
    assert effective_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    for sigma, ratio in ((0.7, 10.0), (3.0, 0.5), (1.3, 2.0)):
        sigma_b = ratio * sigma
        assert effective_noise_multiplier(sigma, ratio) == pytest.approx((sigma**-2 + sigma_b**-2) ** -0.5, rel=1e-12)
    plan = _plan(THRESHOLD, {"tracking": True, "threshold_noise_ratio": 1.0})
    event = plan.event(1.0)
    assert isinstance(event, privacy.PoissonSampledGaussianEvent)
    assert event.noise_multiplier == pytest.approx(1 / math.sqrt(2), rel=1e-12)
    assert event.sampling_probability == 0.01 and event.count == 100
    # Without tracking nothing else is released: σ is charged as is.
    assert _plan(THRESHOLD, {"threshold_noise_ratio": 1.0}).event(1.0).noise_multiplier == 1.0


def test_calibration_solves_for_sigma_through_the_joint_event() -> None:
    ratio = 2.0
    dp_sgd = _job("dp-sgd", {}, {"target_epsilon": 2.0})
    tracked = _job(THRESHOLD, {"tracking": True, "threshold_noise_ratio": ratio}, {"target_epsilon": 2.0})
    # The charged event has σ_eff = σ/sqrt(1 + 1/r²) = the σ DP-SGD needs for the same ε.
    event = privacy.event_from_json(tracked.event_json)
    assert event.noise_multiplier == pytest.approx(dp_sgd.noise_multiplier, rel=1e-5)
    assert tracked.noise_multiplier == pytest.approx(dp_sgd.noise_multiplier * math.sqrt(1 + 1 / ratio**2), rel=1e-5)
    assert tracked.epsilon_ledger <= 2.0
    # The gradient's noise is σ·c1 with the (larger) job σ; the count's is r·σ.
    assert tracked.noise_std_on_sum == pytest.approx(tracked.noise_multiplier * 1.0)


# ----------------------------------------------------------------------------- T17 no ε split


@pytest.mark.parametrize("name", [RANK, THRESHOLD])
def test_trace_noise_and_selection_knobs_leave_epsilon_unchanged(name: str) -> None:
    base = _job(name, {}, {"target_epsilon": 2.0})
    variants = [
        {"sigma_tr": 0.5},
        {"sigma_tr": 5.0},
        {"k": 20, "theta": 1.0},
        {"scope": ["1.weight"]},
        {"p": 0.05},
        {"optimizer": "adam"},
    ]
    if name == THRESHOLD:
        variants += [{"tau": 0.3}, {"eta_tau": 1.0, "threshold_noise_ratio": 3.0}]
    for hyper in variants:
        job = _job(name, hyper, {"target_epsilon": 2.0})
        assert job.event_json == base.event_json, hyper
        assert job.epsilon_ledger == base.epsilon_ledger
        assert job.noise_multiplier == base.noise_multiplier


# ----------------------------------------------------------------------------- the paper's claim


def test_paper_claim_is_labelled_and_never_charged() -> None:
    """The authors' MNIST setting (docs/algorithms/dc-dpsgd.md#why-the-papers-calibration-does-not-hold):
    σ(ε/2 = 4) = 0.7048 for both halves → the paper claims (≈8, 2δ)."""
    q, steps = 128 / 60000, 18750
    claim = paper_claimed_epsilon(
        sampling_probability=q, steps=steps, delta=DELTA, noise_multiplier=0.7048, sigma_tr=0.7048
    )
    assert claim.label == PAPER_CLAIM_LABEL == "as claimed in the paper — not a valid guarantee"
    assert claim.epsilon == pytest.approx(8.0, rel=0.02)
    assert claim.epsilon == pytest.approx(claim.epsilon_trace + claim.epsilon_gradient)
    assert claim.delta == 2 * DELTA
    entry = claim.as_report_entry()
    assert entry["label"] == PAPER_CLAIM_LABEL and entry["valid_guarantee"] is False

    # σ_tr = 0 (our default): the paper's argument gives no finite number at all.
    no_trace_noise = paper_claimed_epsilon(
        sampling_probability=q, steps=steps, delta=DELTA, noise_multiplier=0.7048, sigma_tr=0.0
    )
    assert math.isinf(no_trace_noise.epsilon)
    assert no_trace_noise.as_report_entry()["epsilon"] is None

    # Through the catalogue entry, and it does not touch the charged event.
    algorithm = get_algorithm(RANK)
    hyper = algorithm.validate_hyperparameters({"sigma_tr": 2.0})
    plan = _plan(RANK, {"sigma_tr": 2.0})
    via_entry = algorithm.paper_claimed_epsilon(hyper, plan, noise_multiplier=1.0, delta=DELTA)
    assert via_entry == paper_claimed_epsilon(
        sampling_probability=0.01, steps=100, delta=DELTA, noise_multiplier=1.0, sigma_tr=2.0
    )
    assert plan.event(1.0) == _plan(RANK, {}).event(1.0)
