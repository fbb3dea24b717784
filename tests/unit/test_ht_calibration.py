"""Heavy-tailed DP-SCO: the public calibration (hand-checked numbers, U7d, U8, U10, U11) and
the events the catalogue charges (parallel composition, Peeling composition, T16)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import InvalidHyperparameters, get_algorithm
from algorithms.ht_dpsco import calibration as cal
from algorithms.ht_dpsco.family import peeling_event
from kernel import privacy
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import ComposedEvent, ExponentialMechanismEvent, LaplaceEvent, PureDPEvent
from kernel.schemas.jobs import TrainingSpec

REL = 5e-6  # six significant digits


def _facts(n: int = 10_000, d: int = 200, task: str = "regression", classes: int | None = None) -> DatasetFacts:
    return DatasetFacts(n_rows=n, feature_shape=(d,), task=task, n_classes=classes)


ONE_EPOCH = TrainingSpec(epochs=1)


# ----------------------------------------------------------------------------- U8 golden numbers


def test_alg1_paper_preset_golden() -> None:
    n, eps = 10_000, 1.0
    T = cal.fw_paper_iterations(n=n, epsilon=eps)
    kappa = cal.fw_paper_kappa(n=n, epsilon=eps)
    m = n // T
    delta_paper = cal.fw_score_sensitivity_replace_one(kappa=kappa, block_size=m, vertex_norm=2.0)
    assert (T, m, kappa) == (21, 476, 10_000.0)
    assert delta_paper == pytest.approx(79.2277, rel=REL)
    assert eps / (2 * delta_paper) == pytest.approx(0.00631093, rel=REL)


def test_alg1_theory_preset_golden_and_tight_mode() -> None:
    n, d, eps = 10_000, 200, 1.0
    T = cal.fw_theory_iterations(n=n, epsilon=eps, alpha=1, tau=1, n_vertices=400, d=d, zeta=0.05)
    kappa = cal.fw_theory_kappa(n=n, epsilon=eps, tau=1, iterations=T, n_vertices=400, d=d, zeta=0.05)
    m = n // T
    assert (T, m) == (9, 1111)
    assert kappa == pytest.approx(8.21040, rel=REL)
    paper = cal.fw_score_sensitivity_replace_one(kappa=kappa, block_size=m, vertex_norm=2.0)
    tight = cal.fw_score_sensitivity_replace_one(kappa=kappa, block_size=m, vertex_norm=1.0)
    assert paper == pytest.approx(0.0278698, rel=REL)
    assert eps / (2 * paper) == pytest.approx(17.9406, rel=REL)
    assert tight == pytest.approx(0.0139349, rel=REL)
    # add/remove (what the service charges) is exactly half of replace-one
    assert cal.fw_score_sensitivity(kappa=kappa, block_size=m, vertex_norm=2.0) == pytest.approx(paper / 2, rel=1e-15)


def test_alg2_golden() -> None:
    n, eps = 10_000, 1.0
    delta = n**-1.1
    T = cal.lasso_paper_iterations(n=n, epsilon=eps)
    K = cal.lasso_truncation(n=n, epsilon=eps, iterations=T)
    assert delta == pytest.approx(3.98107e-5, rel=REL)
    assert T == 39
    assert pytest.approx(6.32582, rel=REL) == K
    eps0 = cal.lasso_paper_step_epsilon(epsilon=eps, iterations=T, delta=delta)
    assert eps0 == pytest.approx(0.0177864, rel=REL)
    paper = cal.lasso_score_sensitivity_replace_one(truncation=K, radius=1.0, n=n, vertex_norm=2.0)
    tight = cal.lasso_score_sensitivity_replace_one(truncation=K, radius=1.0, n=n, vertex_norm=1.0)
    assert paper == pytest.approx(0.0640256, rel=REL)
    assert tight == pytest.approx(0.0320128, rel=REL)
    assert eps0 / (2 * paper) == pytest.approx(0.138901, rel=REL)


def test_alg3_golden() -> None:
    n, eps, s, T, eta0 = 50_000, 1.0, 40, 10, 0.1
    delta = n**-1.1
    K = cal.linreg_truncation(n=n, epsilon=eps, sparsity=s, iterations=T)
    lam = cal.linreg_sensitivity_replace_one(truncation=K, step=eta0, sparsity=s, radius=1.0, block_size=5000)
    b = cal.peeling_scale_paper(sensitivity=lam, sparsity=s, epsilon=eps, delta=delta)
    assert delta == pytest.approx(6.77849e-6, rel=REL)
    assert pytest.approx(3.34370, rel=REL) == K
    assert lam == pytest.approx(0.00327564, rel=REL)
    assert b == pytest.approx(0.247584, rel=REL)


def test_alg5_golden_box_and_tight() -> None:
    n, eps, s, T, m, eta, delta = 8000, 1.0, 40, 8, 1000, 0.5, 5.08863e-5
    k_paper = cal.sparse_opt_paper_scale(n=n, epsilon=eps)
    box = cal.sparse_opt_sensitivity_replace_one(scale=k_paper, step=eta, block_size=m, box=True)
    tight = cal.sparse_opt_sensitivity_replace_one(scale=k_paper, step=eta, block_size=m, box=False)
    assert box == pytest.approx(22.6274, rel=REL)
    assert tight == pytest.approx(7.54247, rel=REL)
    assert cal.peeling_scale_paper(sensitivity=box, sparsity=s, epsilon=eps, delta=delta) == pytest.approx(
        1558.71, rel=REL
    )
    assert cal.peeling_scale_paper(sensitivity=tight, sparsity=s, epsilon=eps, delta=delta) == pytest.approx(
        519.569, rel=REL
    )
    k_theory = cal.sparse_opt_theory_scale(n=n, epsilon=eps, tau=1.0, sparsity=s, iterations=T, zeta=0.05)
    assert k_theory == pytest.approx(2.90599, rel=REL)


def test_peeling_scale_keeps_epsilon_outside_the_root() -> None:
    """U7d: [R] computes 2λ√(3s·ln(1/δ)/ε); at ε ≠ 1 the values must differ."""
    lam, s, eps, delta = 0.01, 10, 4.0, 1e-6
    ours = cal.peeling_scale_paper(sensitivity=lam, sparsity=s, epsilon=eps, delta=delta)
    bug = 2 * lam * math.sqrt(3 * s * math.log(1 / delta) / eps)
    assert ours == pytest.approx(2 * lam * math.sqrt(3 * s * math.log(1 / delta)) / eps, rel=1e-15)
    assert ours != pytest.approx(bug, rel=0.1)


# ----------------------------------------------------------------------------- events


@pytest.mark.parametrize("name", ["ht-dp-fw", "ht-sparse-linreg", "ht-sparse-opt"])
def test_block_algorithms_cost_one_iteration_whatever_the_steps(name: str) -> None:
    """Parallel composition over per-row-random disjoint blocks: k ≥ 1 steps cost one iteration."""
    algorithm = get_algorithm(name)
    plan = algorithm.plan(algorithm.Hyperparameters(), ONE_EPOCH, _facts())
    assert plan.steps > 1 and plan.sampling == "disjoint-blocks"
    one = privacy.rdp_curve(plan.event_for(0.7, 1))
    assert privacy.rdp_curve(plan.event_for(0.7, plan.steps)) == one
    assert privacy.rdp_curve(plan.event_for(0.7, 0)) == privacy.rdp_curve(plan.event_for(0.7, 0))
    assert all(v == 0.0 for v in privacy.rdp_curve(plan.event_for(0.7, 0)))
    assert plan.expected_batch_size == pytest.approx(10_000 / plan.steps)


def test_fw_event_is_one_bounded_range_mechanism_at_one_over_sigma() -> None:
    algorithm = get_algorithm("ht-dp-fw")
    plan = algorithm.plan(algorithm.Hyperparameters(), ONE_EPOCH, _facts())
    assert plan.event_for(0.5, plan.steps) == ExponentialMechanismEvent(epsilon=2.0, count=1)
    noisy_max = algorithm.Hyperparameters(selection="laplace-noisy-max")
    assert algorithm.plan(noisy_max, ONE_EPOCH, _facts()).event_for(0.5, 3) == PureDPEvent(epsilon=2.0, count=1)


def test_lasso_composes_every_iteration() -> None:
    algorithm = get_algorithm("ht-private-lasso")
    plan = algorithm.plan(algorithm.Hyperparameters(preset="paper-experiments"), ONE_EPOCH, _facts())
    assert plan.steps == 39 and plan.sampling == "full-batch"
    assert plan.event_for(4.0, 7) == ExponentialMechanismEvent(epsilon=0.25, count=7)


def test_lasso_rdp_calibration_is_looser_noise_than_the_papers_split_at_the_same_guarantee() -> None:
    """The paper's ε₀ (advanced composition) meets the target in the ledger too, and the RDP
    calibration the service runs gives a larger ε₀ (less noise) for the same (ε, δ)."""
    n, eps, T = 10_000, 1.0, 39
    delta = n**-1.1
    paper_eps0 = cal.lasso_paper_step_epsilon(epsilon=eps, iterations=T, delta=delta)

    def event(sigma: float) -> ExponentialMechanismEvent:
        return ExponentialMechanismEvent(epsilon=1 / sigma, count=T)

    assert privacy.ledger_epsilon(privacy.rdp_curve(event(1 / paper_eps0)), delta) <= eps
    sigma = privacy.calibrate_noise_multiplier(event, target_epsilon=eps, delta=delta)
    assert 1 / sigma > 2 * paper_eps0


@pytest.mark.parametrize(("eps", "s"), [(0.5, 5), (1.0, 20), (1.0, 40)])
def test_peeling_event_at_the_papers_scale_meets_the_target_and_calibration_is_close(eps: float, s: int) -> None:
    """Golden noise scales: the RDP composition of Peeling at the paper's b is within ε (an
    advanced-composition check gives 0.92–0.94; RDP gives 0.60–0.89 here), so the
    calibrated b is at most the paper's and not far below it."""
    n = 50_000
    delta = n**-1.1
    lam = 1.0
    paper_sigma = cal.peeling_scale_paper(sensitivity=lam, sparsity=s, epsilon=eps, delta=delta) / lam
    ratio = privacy.ledger_epsilon(privacy.rdp_curve(peeling_event(paper_sigma, sparsity=s, uses=1)), delta) / eps
    assert 0.5 < ratio <= 1.0
    sigma = privacy.calibrate_noise_multiplier(
        lambda x: peeling_event(x, sparsity=s, uses=1), target_epsilon=eps, delta=delta
    )
    assert 0.5 * paper_sigma < sigma <= paper_sigma


def test_peeling_event_structure() -> None:
    assert peeling_event(2.0, sparsity=3, uses=1) == ComposedEvent(
        events=(PureDPEvent(epsilon=1.0, count=3), LaplaceEvent(noise_multiplier=2.0, count=3))
    )


# ----------------------------------------------------------------------------- U10, U11


@settings(max_examples=30, deadline=None)
@given(n=st.integers(100, 10**6), d=st.integers(5, 5000), eps=st.floats(0.05, 20))
def test_resolution_is_a_function_of_public_inputs_only(n: int, d: int, eps: float) -> None:
    """U10: the plan is built from (hyperparameters, training spec, n, d) — there is no data
    argument at all — and the same inputs give the same parameters."""
    for name in ("ht-dp-fw", "ht-sparse-linreg", "ht-sparse-opt"):
        algorithm = get_algorithm(name)
        hyper = (
            algorithm.Hyperparameters(design_epsilon=eps, s_star=1)
            if name != "ht-dp-fw"
            else algorithm.Hyperparameters(design_epsilon=eps)
        )
        try:
            first = algorithm.resolve(hyper, training=ONE_EPOCH, training_rows=n, facts=_facts(n, d))
        except InvalidHyperparameters:
            continue
        again = algorithm.resolve(hyper, training=ONE_EPOCH, training_rows=n, facts=_facts(n, d))
        assert first == again
        assert all(math.isfinite(v) and v > 0 for v in vars(first).values() if isinstance(v, float))


@pytest.mark.parametrize(
    ("name", "hyperparameters", "facts", "training", "message"),
    [
        ("ht-sparse-linreg", {"s_star": 300}, _facts(d=200), ONE_EPOCH, "exceeds"),
        ("ht-sparse-opt", {}, _facts(n=19), TrainingSpec(steps=1), "n ≥ 20"),
        ("ht-dp-fw", {}, _facts(n=50), TrainingSpec(steps=60), "fewer than one"),
        ("ht-dp-fw", {}, _facts(), TrainingSpec(epochs=2), "epochs must be 1"),
        ("ht-private-lasso", {}, _facts(task="classification", classes=2), ONE_EPOCH, "squared loss"),
        ("ht-sparse-linreg", {}, _facts(task="classification", classes=2), ONE_EPOCH, "squared loss"),
        ("ht-dp-fw", {}, _facts(task="classification", classes=3), ONE_EPOCH, "two classes"),
    ],
)
def test_preconditions_are_rejected(
    name: str, hyperparameters: dict, facts: DatasetFacts, training: TrainingSpec, message: str
) -> None:
    algorithm = get_algorithm(name)
    with pytest.raises(InvalidHyperparameters, match=message):
        algorithm.plan(algorithm.validate_hyperparameters(hyperparameters), training, facts)


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("ht-dp-fw", {"tau": 0}),
        ("ht-dp-fw", {"radius": -1}),
        ("ht-dp-fw", {"constraint": "l2_ball"}),
        ("ht-dp-fw", {"unknown": 1}),
        ("ht-dp-fw", {"kappa": float("inf")}),
        ("ht-sparse-opt", {"mu": 2.0, "gamma": 1.0}),
        ("ht-sparse-linreg", {"s_star": 0}),
        ("ht-private-lasso", {"zeta": 1.0}),
        ("ht-sparse-opt", {"sensitivity_mode": "loose"}),
    ],
)
def test_hyperparameter_schema_rejects_invalid_public_constants(name: str, raw: dict) -> None:
    with pytest.raises(InvalidHyperparameters):
        get_algorithm(name).validate_hyperparameters(raw)


def test_paper_preset_reports_its_caveat_and_labels() -> None:
    algorithm = get_algorithm("ht-sparse-opt")
    hyper = algorithm.Hyperparameters(preset="paper-experiments", design_epsilon=2.0)
    plan = algorithm.plan(hyper, ONE_EPOCH, _facts(n=8000))
    notes = algorithm.report_notes(hyper, plan, noise_multiplier=1.5, delta=1e-5)
    assert "paper" in notes["paper_experiments_preset"]["label"]
    assert "pure noise" in notes["paper_experiments_preset"]["why_poor"]
    assert notes["laplace_scale"] == pytest.approx(1.5 * plan.sensitivity)
    assert "ε ≤ 1" in notes["warning"]


def test_design_epsilon_defaults_to_the_jobs_target_epsilon() -> None:
    """The parameter formulas use the job's (public) target ε unless the user sets design_epsilon;
    the planned spec records the value used, so the report shows what the formulas assumed."""
    from kernel.db.orm import Dataset
    from kernel.jobs.planning import plan_job
    from kernel.schemas.jobs import JobCreate

    dataset = Dataset(n_rows=4000, feature_shape=[10], task="regression", n_classes=None)

    def planned(hyperparameters: dict, privacy_spec: dict) -> dict:
        spec = JobCreate.model_validate(
            {
                "dataset_id": "d",
                "model": {"name": "linear-regression", "params": {}},
                "algorithm": {"name": "ht-dp-fw", "hyperparameters": hyperparameters},
                "privacy": privacy_spec,
                "training": {"epochs": 1},
            }
        )
        plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10**6)
        return plan.spec["algorithm"]["hyperparameters"]

    assert planned({}, {"target_epsilon": 4.0})["design_epsilon"] == 4.0
    assert planned({"design_epsilon": 2.0}, {"target_epsilon": 4.0})["design_epsilon"] == 2.0
    assert planned({}, {"noise_multiplier": 1.0})["design_epsilon"] == 1.0
