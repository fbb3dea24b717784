"""KL-family accounting (algorithms/kl_family/accounting.py, schedules.py): hand-checked replace-one numbers,
the add/remove halving of docs/algorithms/kl-family.md#sensitivities, the worst-case totals,
the budget-unit events, and the
schema's validation of the public constants."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from algorithms import InvalidHyperparameters, get_algorithm
from algorithms.kl_family.accounting import BUDGET_UNITS, rho_of, units_for
from algorithms.kl_family.hyperparameters import KLSpiderHyperparameters
from algorithms.kl_family.schedules import (
    adaptive_constants,
    inner_solver_steps,
    outer_iterations,
    paper_inner_iterations,
    spider_schedule,
)
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import ZCDPEvent, rdp_curve
from kernel.privacy.orders import ORDERS
from kernel.schemas.jobs import TrainingSpec

GOLDEN = dict(n=1e6, d=10, rho=0.5, L0=1.0, L1=1.0, gamma=1.0, kappa=1.5, F0=1.0, beta=0.05, theta=0.5)


# ----------------------------------------------------------------------------- replace-one goldens


def test_spider_constants_match_the_spec_table_under_replace_one() -> None:
    s = spider_schedule(**GOLDEN, neighbour="replace-one")
    assert s is not None
    assert s.c == pytest.approx(1.015625, rel=1e-12)
    assert s.K == 1201 and s.t_max == 81
    assert s.beta_prime == pytest.approx(5.07707e-7, rel=1e-5)
    assert s.c_floor == 40.0
    assert s.phi_floor == pytest.approx(3.62574e-3, rel=1e-5)
    assert s.start_noise == pytest.approx(9.80204e-5, rel=1e-5)
    first, last = s.rounds[0], s.rounds[-1]
    assert first.phi == pytest.approx(0.984615, rel=1e-5)
    assert first.steps == 2 and first.differences == 1
    assert first.step_length == pytest.approx(0.247429, rel=1e-5)
    assert first.difference_clip == pytest.approx(0.247429, rel=1e-5)
    assert first.difference_noise == pytest.approx(2.42531e-5, rel=1e-5)
    assert last.phi == pytest.approx(3.62574e-3, rel=1e-5)
    assert last.steps == 7
    assert last.step_length == pytest.approx(5.900e-3, rel=1e-3)
    assert last.difference_noise == pytest.approx(1.41665e-6, rel=1e-5)
    assert next(k for k, r in enumerate(s.rounds, start=1) if r.phi == s.phi_floor) == 363
    assert s.total_differences == 5935
    assert s.worst_case_share == 1  # worst case charged = 0.5000 = ρ, exactly
    assert float(s.start_share) * GOLDEN["rho"] == pytest.approx(2.08160e-4, rel=1e-5)
    assert float(s.difference_share(1)) * GOLDEN["rho"] == pytest.approx(2.08160e-4, rel=1e-5)


def test_spider_add_remove_halves_every_noise_and_the_floor_constant() -> None:
    """docs/algorithms/kl-family.md#sensitivities: Δ(G) = L0/n, Δ(D) = C/n. At θ = 1/2 the
    round-start std is the paper's own
    σ̂ = L0√K/(n√ρ) = 4.90102e-5, and C_floor = 20."""
    ro = spider_schedule(**GOLDEN, neighbour="replace-one")
    ar = spider_schedule(**GOLDEN)
    assert ro is not None and ar is not None
    assert ar.start_noise == pytest.approx(4.90102e-5, rel=1e-5)
    assert ar.start_noise == pytest.approx(ro.start_noise / 2, rel=1e-12)
    assert ar.c_floor == 20.0
    assert ar.phi_floor < ro.phi_floor  # a smaller floor: the sound accounting helps utility
    for r in ar.rounds[:5]:
        assert r.difference_noise == pytest.approx(
            (r.difference_clip / 1e6) * math.sqrt(ar.K * r.differences / (2 * 0.5 * 0.5)), rel=1e-12
        )


def test_spider_kappa_two_uses_theta_one_and_no_differences() -> None:
    s = spider_schedule(**{**GOLDEN, "kappa": 2.0}, neighbour="replace-one")
    assert s is not None
    assert s.K == 1602 and s.theta == 1.0 and s.total_differences == 0
    assert all(r.steps == 1 for r in s.rounds)
    assert s.start_noise == pytest.approx(8.00500e-5, rel=1e-5)
    assert s.c_floor == pytest.approx(16 * math.sqrt(2))
    assert s.phi_floor == pytest.approx(1.81563e-4, rel=1e-5)
    assert s.worst_case_share == 1


def test_adaptive_constants_match_the_spec_table_under_replace_one() -> None:
    a = adaptive_constants(n=1e4, d=100, rho=1.0, L0=1.0, beta=0.05, neighbour="replace-one")
    assert a is not None
    assert a.log_term == pytest.approx(12.20607, rel=1e-6)
    assert a.norm_noise == pytest.approx(0.01)
    assert a.norm_cost == pytest.approx(2.0e-4)
    assert a.floor_noise == pytest.approx(2.00040e-4, rel=1e-5)
    s = a.gradient_noise(0.5)
    assert s == pytest.approx(0.0143114, rel=1e-5)
    assert a.gradient_cost(s) == pytest.approx(9.765e-5, rel=1e-3)
    assert a.norm_cost + a.gradient_cost(s) == pytest.approx(2.9765e-4, rel=1e-4)
    assert a.gradient_noise(-0.1) == a.floor_noise
    assert a.norm_cost + a.gradient_cost(a.floor_noise) == pytest.approx(0.5, rel=1e-12)


def test_adaptive_add_remove_charges_a_quarter_for_the_same_noise() -> None:
    ro = adaptive_constants(n=1e4, d=100, rho=1.0, L0=1.0, beta=0.05, neighbour="replace-one")
    ar = adaptive_constants(n=1e4, d=100, rho=1.0, L0=1.0, beta=0.05)
    assert ro is not None and ar is not None
    assert ar.norm_noise == ro.norm_noise  # the paper's ŝ is kept ...
    assert ar.norm_cost == pytest.approx(math.sqrt(1.0) / (2 * 1e4))  # ... and costs √ρ/(2n)
    assert ar.floor_noise == pytest.approx(1.0 / (1e4 * math.sqrt(2 * (0.5 - ar.norm_cost))))
    assert ar.max_iterations == 1 + math.floor(0.5 / ar.norm_cost)  # ≤ 1 + n√ρ


def test_alg4_and_alg2_counts_match_the_spec() -> None:
    assert paper_inner_iterations(n=1e4, rho_in=0.1, beta_in=0.05, d=10) == 13_607_832
    sigma = math.sqrt(4 * 13_607_832 / (1e8 * 0.1))  # the paper's σ for those inputs
    assert sigma == pytest.approx(2.33305, rel=1e-5)
    assert (2 / 1e4) ** 2 / (2 * sigma**2) == pytest.approx(3.67435e-9, rel=1e-5)  # replace-one
    assert outer_iterations(n=1e4, d=10, rho=0.1, L0=1.0, L1_tilde=0.5, gamma=1.0, kappa=3.0, F0=1.0) == 353
    assert inner_solver_steps(n=1e4, d=10, rho_in=0.1, beta_in=0.05, cap=50) == 50
    assert inner_solver_steps(n=10, d=10, rho_in=0.01, beta_in=0.05, cap=50) == 1


# ----------------------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(
    n=st.floats(1e3, 1e8),
    d=st.integers(1, 1000),
    rho=st.floats(1e-3, 10.0),
    L0=st.floats(0.5, 5.0),
    L1=st.floats(0.01, 2.0),
    gamma=st.floats(0.2, 2.0),
    kappa=st.floats(1.0, 2.0),
    f0_share=st.floats(0.3, 1.0),
    theta=st.floats(0.05, 0.95),
)
# θ's floor leaves no difference although θ = 1's would: the unused share goes to round starts
@example(n=1000.0, d=1, rho=1.0, L0=3.0, L1=0.5, gamma=1.0, kappa=1.0, f0_share=0.5, theta=0.5)
def test_spider_worst_case_is_exactly_rho_and_each_release_costs_its_share(
    n: float,
    d: int,
    rho: float,
    L0: float,
    L1: float,
    gamma: float,
    kappa: float,
    f0_share: float,
    theta: float,
) -> None:
    F0 = f0_share * (L0 * gamma) ** kappa
    s = spider_schedule(n=n, d=d, rho=rho, L0=L0, L1=L1, gamma=gamma, kappa=kappa, F0=F0, beta=0.05, theta=theta)
    if s is None:
        return
    assert s.worst_case_share == 1
    assert (L0 / n) ** 2 / (2 * s.start_noise**2) == pytest.approx(float(s.start_share) * rho, rel=1e-9)
    previous = math.inf
    for k, r in enumerate(s.rounds, start=1):
        assert r.phi == max(F0 * s.c ** (-k), s.phi_floor) and r.phi <= previous
        previous = r.phi
        assert r.steps >= 1 and r.difference_clip == pytest.approx(L1 * r.step_length)
        if r.differences:
            cost = (r.difference_clip / n) ** 2 / (2 * r.difference_noise**2)
            assert cost == pytest.approx(float(s.difference_share(k)) * rho, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    norms=st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(0.0), st.floats(1e-300, 1e-10)), min_size=1, max_size=400),
    n=st.floats(10.0, 1e7),
    rho=st.floats(1e-4, 10.0),
    d=st.integers(1, 10_000),
)
def test_adaptive_filter_never_exceeds_rho_for_any_released_norms(
    norms: list[float], n: float, rho: float, d: int
) -> None:
    """Fuzz: whatever the noisy norms (negative, zero, huge), the adaptive noisy GD loop with the
    exact costs spends ≤ ρ and stops after a floor step."""
    a = adaptive_constants(n=n, d=d, rho=rho, L0=1.0, beta=0.05)
    if a is None:
        return
    spent, iterations = 0.0, 0
    for value in norms:
        if spent > rho / 2:
            break
        s = a.gradient_noise(value)
        spent += a.norm_cost + a.gradient_cost(s)
        iterations += 1
        assert a.norm_cost + a.gradient_cost(s) <= rho / 2 * (1 + 1e-12)
        if s == a.floor_noise:
            break
    assert spent <= rho * (1 + 1e-12)
    assert iterations <= a.max_iterations


@given(share=st.fractions(min_value=0, max_value=1))
def test_units_round_up_and_stay_within_the_reservation(share: Fraction) -> None:
    units = units_for(share)
    assert 0 <= units <= BUDGET_UNITS
    assert Fraction(units, BUDGET_UNITS) >= share
    assert units == 0 or Fraction(units - 1, BUDGET_UNITS) < share


# ----------------------------------------------------------------------------- catalogue entries


def _facts(n: int = 500) -> DatasetFacts:
    return DatasetFacts(n_rows=n, feature_shape=(4,), task="regression", n_classes=None)


def _training(**fields: object) -> TrainingSpec:
    return TrainingSpec.model_validate({"steps": 40, **fields})


@pytest.mark.parametrize("name", ["kl-spider", "adaptive-noisy-gd", "proximal-point"])
def test_unit_based_events_charge_rho_over_units_per_step(name: str) -> None:
    algorithm = get_algorithm(name)
    plan = algorithm.plan(algorithm.validate_hyperparameters({}), _training(), _facts(), training_fraction=0.8)
    assert plan.steps == BUDGET_UNITS and plan.sampling_probability == 1.0
    assert plan.expected_batch_size == pytest.approx(400.0)
    sigma = 3.0
    assert plan.event_for(sigma, 7) == ZCDPEvent(rho=rho_of(sigma) / BUDGET_UNITS, count=7)
    full = rdp_curve(plan.event(sigma))
    for order, value in zip(ORDERS, full, strict=True):
        assert value == pytest.approx(order / (2 * sigma**2), rel=1e-9)  # ρ = 1/(2σ²) in all (rounded up)
        assert value >= order / (2 * sigma**2)


def test_noisy_gd_event_is_one_gaussian_per_step() -> None:
    algorithm = get_algorithm("noisy-gd")
    plan = algorithm.plan(algorithm.validate_hyperparameters({"L0": 2.0}), _training(steps=None, epochs=2.5), _facts())
    assert plan.steps == 3 and plan.sensitivity == 2.0
    assert plan.event_for(4.0, 3) == ZCDPEvent(rho=1 / 32, count=3)


@pytest.mark.parametrize("name", ["kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point"])
def test_full_batch_refuses_a_batch_size_and_records_n(name: str) -> None:
    algorithm = get_algorithm(name)
    with pytest.raises(InvalidHyperparameters, match=f"training.batch_size: {name} is full-batch"):
        algorithm.accept_training(_training(batch_size=500), _facts())
    assert algorithm.accept_training(_training(), _facts()).batch_size == 500


@pytest.mark.parametrize(
    ("name", "hyper", "message"),
    [
        ("kl-spider", {"kappa": 2.5}, "kappa"),
        ("kl-spider", {"kappa": 0.5}, "kappa"),
        ("kl-spider", {"L0": 2.0, "gamma": 1.0, "kappa": 2.0, "F0": 4.5}, "F0"),
        ("kl-spider", {"L0": "inf"}, "L0"),
        ("kl-spider", {"gamma": "nan"}, "gamma"),
        ("kl-spider", {"L0": 0}, "L0"),
        ("kl-spider", {"step_size": 0.1}, "step_size"),
        ("adaptive-noisy-gd", {"gamma": 1.0}, "gamma"),  # Alg 3 takes no KL parameters
        ("adaptive-noisy-gd", {"beta": 1.0}, "beta"),
        ("noisy-gd", {"L1_tilde": 0}, "L1_tilde"),
        ("proximal-point", {"kappa": 1.5}, "kappa"),
        ("proximal-point", {"max_inner_steps": 0}, "max_inner_steps"),
    ],
)
def test_public_constants_are_validated(name: str, hyper: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidHyperparameters, match=message):
        get_algorithm(name).validate_hyperparameters(hyper)


def test_f0_defaults_to_the_kl_ceiling_and_the_schema_documents_every_constant() -> None:
    hyper = KLSpiderHyperparameters(L0=2.0, gamma=0.5, kappa=1.5)
    assert pytest.approx(1.0) == hyper.F0
    assert KLSpiderHyperparameters.model_validate(hyper.model_dump()).F0 == hyper.F0  # idempotent
    for name in ("kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point"):
        described = get_algorithm(name).describe()
        for field, schema in described["hyperparameters_schema"]["properties"].items():
            assert schema.get("description"), f"{name}.{field} is undocumented"
    assert "gamma" not in get_algorithm("adaptive-noisy-gd").describe()["hyperparameters_schema"]["properties"]


def test_report_notes_label_the_paper_claims() -> None:
    for name in ("kl-spider", "adaptive-noisy-gd", "proximal-point"):
        algorithm = get_algorithm(name)
        hyper = algorithm.validate_hyperparameters({})
        plan = algorithm.plan(hyper, _training(), _facts())
        notes = algorithm.report_notes(hyper, plan, noise_multiplier=2.0, delta=1e-6)
        assert notes["paper_claim"]["label"] == "as claimed in the paper — not a valid guarantee"
        assert notes["paper_claim"]["valid_guarantee"] is False
        assert notes["rho_zcdp"] == pytest.approx(1 / 8)


def test_the_catalogue_entry_is_torch_free() -> None:
    import subprocess
    import sys

    code = "import sys; import algorithms.kl_family.definition, kernel.jobs.planning; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_schedule_with_a_huge_K_is_built_lazily() -> None:
    """K grows with γ²L1: a schedule of ~1e12 rounds must not be materialised (the run itself is
    bounded by the pass cap)."""
    s = spider_schedule(n=1e9, d=10, rho=0.5, L0=1.0, L1=1e3, gamma=1e3, kappa=1.5, F0=1.0, beta=0.05)
    assert s is not None and s.K > 10**11
    last = s.round(s.K)
    assert last.phi == max(s.F0 * s.c ** (-s.K), s.phi_floor)
    assert s.has_differences == (last.differences > 0)
