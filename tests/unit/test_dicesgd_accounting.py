"""DiceSGD's catalogue entries: schema, the SOUND charge and the paper's labelled claim
(docs/algorithms/dicesgd.md#sound-sensitivity).

Golden values, hand-computed from the formulas of docs/algorithms/dicesgd.md: the GDP helpers, the sound σ1,
Theorem 3.7's closed form, and the "paper mode" accountant form.
"""

from __future__ import annotations

import math
import subprocess
import sys

import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import InvalidHyperparameters, PrivacyPlan, get_algorithm
from algorithms.dicesgd.definition import (
    PAPER_CLAIM_LABEL,
    Thresholds,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
    paper_claim,
    paper_closed_form_epsilon,
    paper_closed_form_sigma,
    sound_average_sensitivity,
    sound_sigma1,
)
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.schemas.jobs import TrainingSpec

NAMES = ("dicesgd", "dicesgd-adam", "dicesgd-auto")
FACTS = DatasetFacts(n_rows=1000, feature_shape=(10,), task="classification", n_classes=2)


def _plan(
    name: str, hyper: dict, *, steps: int = 100, batch_size: int = 10, facts: DatasetFacts = FACTS
) -> PrivacyPlan:
    algorithm = get_algorithm(name)
    training = TrainingSpec(steps=steps, batch_size=batch_size, learning_rate=0.1)
    return algorithm.plan(algorithm.validate_hyperparameters(hyper), training, facts)


# ----------------------------------------------------------------------------- catalogue


def test_entries_are_registered_and_describe_their_schema() -> None:
    for name in NAMES:
        described = get_algorithm(name).describe()
        assert described["name"] == name and described["family"] == "dicesgd"
        properties = described["hyperparameters_schema"]["properties"]
        assert described["hyperparameters_schema"]["additionalProperties"] is False
        for field, schema in properties.items():
            assert schema.get("description"), (name, field)
    c2 = get_algorithm("dicesgd").describe()["hyperparameters_schema"]["properties"]["c2"]
    assert "C2 = r·C1/B" in c2["description"]  # the code's sum-scale mapping is documented


@pytest.mark.parametrize(
    ("name", "hyper"),
    [
        ("dicesgd", {"c1": 0.0}),
        ("dicesgd", {"c1": -1.0}),
        ("dicesgd", {"c2": -0.1}),
        ("dicesgd", {"c1": 1e5}),
        ("dicesgd", {"c1": float("nan")}),
        ("dicesgd", {"c2": float("inf")}),
        ("dicesgd", {"momentum": 1.0}),
        ("dicesgd", {"noise": 0.0}),  # no way to switch the noise off through the API
        ("dicesgd", {"clipping_norm": 1.0}),
        ("dicesgd-adam", {"beta2": 1.0}),
        ("dicesgd-adam", {"momentum": 0.9}),
        ("dicesgd-auto", {"gamma": 0.0}),
        ("dicesgd-auto", {"c1": 1.0}),  # unit thresholds: not a knob
    ],
)
def test_invalid_hyperparameters_are_refused(name: str, hyper: dict) -> None:
    with pytest.raises(InvalidHyperparameters):
        get_algorithm(name).validate_hyperparameters(hyper)


def test_the_catalogue_is_torch_free() -> None:
    code = "import sys; import algorithms.dicesgd.definition, kernel.jobs.planning; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- the charged event


def test_event_is_an_unamplified_gaussian_per_step() -> None:
    plan = _plan("dicesgd", {"c1": 1.0, "c2": 1.0})
    assert plan.steps == 100 and plan.sampling_probability == pytest.approx(0.01)
    assert plan.event(2.0) == privacy.GaussianEvent(noise_multiplier=2.0, count=100)
    assert plan.event_for(2.0, 7) == privacy.GaussianEvent(noise_multiplier=2.0, count=7)
    assert plan.expected_batch_size == 10
    # sum-scale sensitivity: B·(C1/B + 2·C2) = 1 + 2·10·1
    assert plan.sensitivity == pytest.approx(21.0)


def test_auto_uses_unit_thresholds_and_adam_matches_dicesgd() -> None:
    assert _plan("dicesgd-auto", {"gamma": 0.5}).sensitivity == pytest.approx(1 + 2 * 10)
    assert _plan("dicesgd-adam", {"c1": 0.3, "c2": 0.02}).sensitivity == pytest.approx(
        _plan("dicesgd", {"c1": 0.3, "c2": 0.02}).sensitivity
    )


@settings(max_examples=100, deadline=None)
@given(
    c1=st.floats(min_value=1e-3, max_value=1e3),
    c2=st.floats(min_value=0.0, max_value=1e3),
    batch=st.integers(min_value=1, max_value=1000),
)
def test_sensitivity_is_c1_over_b_plus_twice_c2(c1: float, c2: float, batch: int) -> None:
    expected = c1 / batch + 2 * c2
    assert sound_average_sensitivity(c1=c1, c2=c2, expected_batch_size=batch) == pytest.approx(expected)
    plan = _plan("dicesgd", {"c1": c1, "c2": c2}, batch_size=batch)
    assert plan.sensitivity / plan.expected_batch_size == pytest.approx(expected)


def test_calibrated_sigma_is_at_least_the_exact_gdp_sigma_and_the_event_meets_the_target() -> None:
    """N = 1000, B = 10, T = 100, ε = 1, C1 = C2 = 1: the sound σ1 is 78.3433 (exact GDP). The ledger
    calibrates in RDP (looser than GDP), so its σ1 is larger; PRV of its event is ≤ 1."""
    plan = _plan("dicesgd", {"c1": 1.0, "c2": 1.0})
    sigma = privacy.calibrate_noise_multiplier(plan.event, target_epsilon=1.0, delta=1e-5)
    sigma1 = sigma * plan.sensitivity / plan.expected_batch_size
    assert sigma1 >= 78.3433
    assert sigma1 <= 1.3 * 78.3433
    assert privacy.ledger_epsilon(privacy.rdp_curve(plan.event(sigma)), 1e-5) <= 1.0 + 1e-9
    prv = privacy.prv_epsilon(plan.event(sigma), 1e-5)
    assert prv is not None and prv <= 1.0
    # at the exact GDP σ1 the charged event is (1, 1e-5): PRV agrees within its 0.01 error
    at_gdp = plan.event(78.3433 / 2.1)
    assert privacy.prv_epsilon(at_gdp, 1e-5) == pytest.approx(1.0, abs=0.02)


def test_charged_event_agrees_with_dp_accounting_pld() -> None:
    """Independent accountant: T composed plain Gaussians (sampling rate 1) at σ = 78.3433/2.1."""
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=78.3433 / 2.1), 100)
    assert accountant.get_epsilon(1e-5) == pytest.approx(1.0, abs=0.01)


# ----------------------------------------------------------------------------- golden values


def test_gdp_helpers_p4() -> None:
    assert gdp_delta(epsilon=1.0, mu=1.0) == pytest.approx(0.1269367, abs=1e-7)
    assert gdp_mu(epsilon=1.0, delta=1e-5) == pytest.approx(0.2680511, abs=1e-7)
    assert 1 / gdp_mu(epsilon=1.0, delta=1e-5) == pytest.approx(3.7306, abs=1e-4)
    assert gdp_mu(epsilon=2.0, delta=1e-5) == pytest.approx(0.501552, abs=1e-6)
    assert gdp_mu(epsilon=8.0, delta=8e-6) == pytest.approx(1.651490, abs=1e-6)


def test_sound_s1_p5_and_round_trip() -> None:
    v1 = sound_sigma1(epsilon=1.0, delta=1e-5, steps=100, c1=1.0, c2=1.0, expected_batch_size=10)
    assert v1 == pytest.approx(78.3433, abs=1e-4)
    v2 = sound_sigma1(epsilon=0.5, delta=1e-5, steps=1000, c1=1.0, c2=1.0, expected_batch_size=100)
    assert v2 == pytest.approx(446.955, abs=1e-3)
    assert gdp_mu(epsilon=0.5, delta=1e-5) == pytest.approx(0.142211, abs=1e-6)
    for sigma1, steps, delta_avg, eps in ((v1, 100, 2.1, 1.0), (v2, 1000, 2.01, 0.5)):
        back = gdp_epsilon(mu=math.sqrt(steps) * delta_avg / sigma1, delta=1e-5)
        assert back == pytest.approx(eps, abs=1e-9)


def test_reference_table_s1_cifar_setting() -> None:
    """The CIFAR setting N = 50k, B = 1k, T = 150, (2, 1e-5): σ1 = 48.86 with C2 = 1, 0.0733 with C2 = 1/B."""
    kw = dict(epsilon=2.0, delta=1e-5, steps=150, c1=1.0, expected_batch_size=1000)
    assert sound_sigma1(c2=1.0, **kw) == pytest.approx(48.86, abs=0.01)
    assert sound_sigma1(c2=1e-3, **kw) == pytest.approx(0.0733, abs=1e-4)


def test_paper_closed_form_p1() -> None:
    """(P-a) with the C.4 reading G̃ = 3: V1 0.3324516, V2 2.102609; its inverse round-trips."""
    v1 = paper_closed_form_sigma(n=1000, steps=100, epsilon=1.0, delta=1e-5, g_tilde=3.0)
    assert v1 == pytest.approx(0.3324516, abs=1e-7)
    assert v1 == pytest.approx(math.sqrt(96 * 100 * math.log(1e5)) / 1000)
    v2 = paper_closed_form_sigma(n=1000, steps=1000, epsilon=0.5, delta=1e-5, g_tilde=3.0)
    assert v2 == pytest.approx(2.102609, abs=1e-6)
    assert paper_closed_form_epsilon(n=1000, steps=100, sigma1=v1, delta=1e-5, g_tilde=3.0) == pytest.approx(1.0)


def test_paper_accountant_form_p3() -> None:
    """(P-c) V1: z* = 1.0802 (RDP) ⇒ σ1 = z*·√6/B = 0.26459 claims ε ≈ 1 (our order grid: 2%).
    G̃ = 3 is C = B·C2 = 1, i.e. C2 = 1/B = 0.1."""
    claim = paper_claim(
        Thresholds(c1=1.0, c2=0.1),
        expected_batch_size=10,
        sampling_probability=0.01,
        steps=100,
        sigma1=0.26459,
        delta=1e-5,
    )
    assert claim.g_tilde == pytest.approx(3.0)
    assert claim.effective_noise_multiplier == pytest.approx(1.0802, abs=1e-4)
    assert claim.epsilon == pytest.approx(1.0, rel=0.02)


def test_paper_claim_is_labelled_far_below_the_sound_epsilon_and_never_charged() -> None:
    algorithm = get_algorithm("dicesgd")
    hyper = algorithm.validate_hyperparameters({"c1": 1.0, "c2": 0.1})
    plan = _plan("dicesgd", {"c1": 1.0, "c2": 0.1})
    sigma = privacy.calibrate_noise_multiplier(plan.event, target_epsilon=2.0, delta=1e-5)
    notes = algorithm.report_notes(hyper, plan, noise_multiplier=sigma, delta=1e-5)
    claim = notes["paper_claim"]
    assert claim["label"] == PAPER_CLAIM_LABEL == "as claimed in the paper — not a valid guarantee"
    assert claim["valid_guarantee"] is False
    assert claim["epsilon"] < 0.5 * 2.0  # amplification on everything: the paper claims far less
    sound = notes["sound_accounting"]
    assert sound["sensitivity_on_average"] == pytest.approx(0.1 + 0.2)
    assert sound["epsilon_gdp_exact"] <= 2.0
    # nothing about the hidden state: only public quantities appear in the notes
    text = repr(notes).lower()
    assert "norm of e" not in text and "error_norm" not in text


def test_sound_noise_is_far_above_dp_sgds_at_equal_epsilon() -> None:
    """The headline consequence: at (2, 1e-5), N = 1000, B = 10, T = 100 with C1 = C2 = 1 the
    DiceSGD noise on the average is > 100× DP-SGD's."""
    dp = get_algorithm("dp-sgd")
    dp_plan = dp.plan(
        dp.validate_hyperparameters({"clipping_norm": 1.0}),
        TrainingSpec(steps=100, batch_size=10, learning_rate=0.1),
        FACTS,
    )
    dp_sigma = privacy.calibrate_noise_multiplier(dp_plan.event, target_epsilon=2.0, delta=1e-5)
    dice_plan = _plan("dicesgd", {"c1": 1.0, "c2": 1.0})
    dice_sigma = privacy.calibrate_noise_multiplier(dice_plan.event, target_epsilon=2.0, delta=1e-5)
    dp_std = dp_sigma * 1.0 / 10
    dice_std = dice_sigma * dice_plan.sensitivity / 10
    assert dice_std / dp_std > 100
