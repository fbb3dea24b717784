"""Worker side of the KL family: the noise drawn is the noise charged, the releases have the
declared add/remove sensitivities, Spider's invariants hold, runs resume exactly, a cancel is
settled within its charge, and the synthetic least-squares excess risk falls with n."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from algorithms.kl_family.accounting import BUDGET_UNITS, NOISE_SAFETY, rho_of, units_for
from algorithms.kl_family.common import FullBatch, assign_flat
from algorithms.kl_family.schedules import adaptive_constants, inner_solver_steps, outer_iterations, spider_schedule
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks, TrainingState
from dp.per_example.per_sample import iter_per_sample_grads
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import JobPlan, plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_training_state, save_training_state

N_ROWS, N_FEATURES = 240, 150

Release = tuple[str, torch.Tensor, torch.Tensor, float]


def _plan(
    name: str,
    hyper: dict[str, Any],
    *,
    n: int = N_ROWS,
    features: int = N_FEATURES,
    task: str = "classification",
    epsilon: float = 2.0,
    steps: int = 60,
    evaluation: dict[str, Any] | None = None,
) -> JobPlan:
    dataset = Dataset(n_rows=n, feature_shape=[features], task=task, n_classes=2 if task == "classification" else None)
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression" if task == "classification" else "linear-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": epsilon},
            "training": {"steps": steps},
            "evaluation": evaluation,
        }
    )
    return plan_job(spec, dataset, dataset_delta=1e-5, max_steps=1_000_000)


def _model(task: str, features: int, seed: int = 0) -> torch.nn.Module:
    return build_model(
        "logistic-regression" if task == "classification" else "linear-regression",
        {},
        input_shape=(features,),
        n_outputs=2 if task == "classification" else 1,
        generator=torch.Generator().manual_seed(seed),
    )


def _request(
    job: JobPlan,
    model: torch.nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int = 1,
    hooks: TrainingHooks | None = None,
    resume_from: TrainingState | None = None,
) -> TrainingRequest:
    return TrainingRequest(
        model=model,
        features=TensorRows(X),
        y=y,
        task="classification" if job.model_name == "logistic-regression" else "regression",
        hyperparameters=job.hyperparameters,
        training=job.training,
        noise_multiplier=job.noise_multiplier,
        sampling_probability=job.plan.sampling_probability,
        expected_batch_size=job.plan.expected_batch_size,
        steps=job.plan.steps,
        max_physical_batch_size=64,
        generator=SecureRandom.from_seed(seed),
        hooks=hooks or TrainingHooks(),
        resume_from=resume_from,
        device=torch.device("cpu"),
    )


def _run(job: JobPlan, X: torch.Tensor, y: torch.Tensor, **kwargs: Any) -> tuple[list[Release], Any, torch.nn.Module]:
    model = _model("classification" if job.model_name == "logistic-regression" else "regression", X.shape[1])
    releases: list[Release] = []

    def observe(kind: str, point: torch.Tensor, released: torch.Tensor, noise_std: float) -> None:
        releases.append((kind, point.clone(), released.clone(), noise_std))

    trainer = get_trainer(job.algorithm.name)
    result = trainer(_request(job, model, X, y, **kwargs), observe)  # type: ignore[call-arg]
    return releases, result, model


def _zero_data(n: int = N_ROWS, features: int = N_FEATURES) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero inputs: every WEIGHT coordinate of a gradient (and of a gradient difference) is 0."""
    return torch.zeros(n, features), torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(5))


def _weight_noise(releases: list[Release], kind: str) -> tuple[np.ndarray, list[float]]:
    weights = 2 * N_FEATURES  # logistic regression: weight (2 × F) first, then the bias
    noise = [r[2][:weights].numpy() for r in releases if r[0] == kind]
    stds = [r[3] for r in releases if r[0] == kind]
    return np.stack(noise) if noise else np.zeros((0, weights)), stds


def _assert_standard_normal(z: np.ndarray) -> None:
    z = z.ravel()
    assert z.size >= 300
    assert abs(float(z.std()) - 1.0) < max(0.03, 5 / math.sqrt(2 * z.size))  # 5 standard errors
    assert abs(float(z.mean())) < 5 / math.sqrt(z.size)
    assert stats.kstest(z, "norm").pvalue > 1e-4


def _zcdp_total(event: Any) -> float:
    assert isinstance(event, privacy.ZCDPEvent)
    return event.rho * event.count


# ----------------------------------------------------------------------------- noise conformance


@pytest.mark.parametrize(
    "evaluation",
    [None, {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.2}],
    ids=["all-rows", "with-holdout"],
)
def test_noisy_gd_draws_the_charged_noise(evaluation: dict[str, Any] | None) -> None:
    """Each step adds N(0, (σ·L0/m)²): σ the calibrated multiplier, m the PUBLIC expected rows."""
    job = _plan("noisy-gd", {"L0": 0.7, "L1_tilde": 0.5}, steps=12, evaluation=evaluation)
    event = privacy.event_from_json(job.event_json)
    if evaluation is not None:
        event = event.events[0]  # type: ignore[union-attr]
    assert event == privacy.ZCDPEvent(rho=rho_of(job.noise_multiplier), count=12)
    m = job.plan.expected_batch_size
    assert m == pytest.approx(N_ROWS * (0.75 if evaluation else 1.0))
    X, y = _zero_data(n=int(m))
    releases, result, _ = _run(job, X, y)
    assert result.steps_run == 12 and len(releases) == 12
    noise, stds = _weight_noise(releases, "gradient")
    expected = job.noise_multiplier * 0.7 / m
    assert all(s == pytest.approx(expected, rel=1e-12) for s in stds)
    _assert_standard_normal(noise / expected)


def test_proximal_point_draws_the_charged_noise() -> None:
    hyper = {"L0": 1.0, "L1_tilde": 0.5, "gamma": 1.0, "kappa": 2.0, "F0": 1.0, "max_inner_steps": 3}
    job = _plan("proximal-point", hyper, epsilon=4.0, steps=40)
    rho = rho_of(job.noise_multiplier)
    d = 2 * N_FEATURES + 2
    t_out = outer_iterations(n=N_ROWS, d=d, rho=rho, L0=1.0, L1_tilde=0.5, gamma=1.0, kappa=2.0, F0=1.0)
    steps = inner_solver_steps(n=N_ROWS, d=d, rho_in=rho / t_out, beta_in=0.05 / t_out, cap=3)
    assert t_out >= 1 and steps == 3
    X, y = _zero_data()
    releases, result, _ = _run(job, X, y)
    expected = (1.0 / N_ROWS) * math.sqrt(t_out * steps / (2 * rho))  # every release: ρ/(T_out·S)
    noise, stds = _weight_noise(releases, "gradient")
    assert len(stds) == min(40, t_out * steps)
    assert all(s == pytest.approx(expected, rel=1e-12) for s in stds)
    _assert_standard_normal(noise / expected)
    spent = len(stds) / (t_out * steps)
    assert result.steps_run == math.ceil(spent * BUDGET_UNITS - 1e-9)
    charged = _zcdp_total(job.plan.event_for(job.noise_multiplier, result.steps_run))
    drawn = sum((1.0 / N_ROWS) ** 2 / (2 * s * s) for s in stds)
    assert drawn <= charged * (1 + 1e-9) and charged - drawn <= rho / BUDGET_UNITS


SPIDER_HYPER = {"L0": 1.0, "L1": 0.05, "gamma": 1.0, "kappa": 1.5, "F0": 1.0}
SPIDER_N, SPIDER_FEATURES = 1000, 20


def _spider_job() -> tuple[JobPlan, Any, torch.Tensor, torch.Tensor]:
    """A non-vacuous schedule (n√ρ large for d = 21) on data whose clipped gradients align, so
    that rounds take steps and release differences."""
    job = _plan(
        "kl-spider", SPIDER_HYPER, n=SPIDER_N, features=SPIDER_FEATURES, task="regression", epsilon=60.0, steps=10_000
    )
    schedule = spider_schedule(
        n=SPIDER_N,
        d=SPIDER_FEATURES + 1,
        rho=rho_of(job.noise_multiplier),
        **{k: v for k, v in SPIDER_HYPER.items()},
        beta=0.05,
    )
    assert schedule is not None and not schedule.vacuous and schedule.total_differences > 0
    g = torch.Generator().manual_seed(4)
    X = 0.1 * torch.randn(SPIDER_N, SPIDER_FEATURES, generator=g)
    y = 5.0 + torch.randn(SPIDER_N, generator=g)
    return job, schedule, X, y


def test_kl_spider_draws_the_charged_noise() -> None:
    """Recover every release's noise as released − exact (G at its point; D between the previous
    release's point and its own) and compare with the schedule's std for the charged ρ."""
    job, schedule, X, y = _spider_job()
    rho = rho_of(job.noise_multiplier)
    releases, result, _ = _run(job, X, y)
    kinds = [r[0] for r in releases]
    assert kinds.count("round-start") >= 10 and kinds.count("difference") >= 10
    clip_of = {r.difference_noise: r.difference_clip for r in schedule.rounds if r.differences}
    probe = _model("regression", SPIDER_FEATURES)
    exact = FullBatch(
        X=X,
        y=y,
        loss="mse",
        lipschitz=1.0,
        normaliser=float(SPIDER_N),
        max_physical_batch_size=512,
        generator=SecureRandom.from_seed(0),
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
    )
    z, drawn = [], 0.0
    for index, (kind, point, released, std) in enumerate(releases):
        assign_flat(probe, point)
        if kind == "round-start":
            assert std == schedule.start_noise
            value = _flat(exact.clipped_sum(probe)) / SPIDER_N
            drawn += (1.0 / SPIDER_N) ** 2 / (2 * std * std)
        else:
            assert std in clip_of
            previous = releases[index - 1][1]
            value = _flat(exact.clipped_difference_sum(probe, previous, clip=clip_of[std])) / SPIDER_N
            drawn += (clip_of[std] / SPIDER_N) ** 2 / (2 * std * std)
        z.append(((released - value) / std).numpy())
    _assert_standard_normal(np.concatenate(z))
    # The exact cost of what was drawn (Δ = L0/n and C_k/n) never exceeds what the ledger settles.
    charged = _zcdp_total(job.plan.event_for(job.noise_multiplier, result.steps_run))
    assert drawn <= charged * (1 + 1e-9) and charged - drawn <= rho / BUDGET_UNITS


def test_adaptive_noisy_gd_draws_the_charged_noise() -> None:
    """Recover the norm and gradient noise as released − exact at each iterate; the gradient's std
    must be the public function of the RELEASED norm, and the drawn cost stays within the charge."""
    job = _plan(
        "adaptive-noisy-gd",
        {"L0": 1.0, "L1": 1.5},
        n=SPIDER_N,
        features=SPIDER_FEATURES,
        task="regression",
        epsilon=3.0,
        steps=500,
    )
    rho = rho_of(job.noise_multiplier)
    constants = adaptive_constants(n=SPIDER_N, d=SPIDER_FEATURES + 1, rho=rho, L0=1.0, beta=0.05)
    assert constants is not None
    _, _, X, y = _spider_job()
    releases, result, _ = _run(job, X, y)
    norms = [r for r in releases if r[0] == "norm"]
    gradients = [r for r in releases if r[0] == "gradient"]
    assert len(norms) == len(gradients) >= 10
    probe = _model("regression", SPIDER_FEATURES)
    exact = FullBatch(
        X=X,
        y=y,
        loss="mse",
        lipschitz=1.0,
        normaliser=float(SPIDER_N),
        max_physical_batch_size=512,
        generator=SecureRandom.from_seed(0),
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
    )
    z_norm, z_grad, drawn = [], [], 0.0
    for (_, point, noisy_norm, norm_std), (_, grad_point, noisy_grad, grad_std) in zip(norms, gradients, strict=True):
        assert norm_std == constants.norm_noise and torch.equal(point, grad_point)
        assign_flat(probe, point)
        value = _flat(exact.clipped_sum(probe)) / SPIDER_N
        z_norm.append((float(noisy_norm[0]) - float(value.norm())) / norm_std)
        assert grad_std == constants.gradient_noise(float(noisy_norm[0]))
        z_grad.append(((noisy_grad - value) / grad_std).numpy())
        drawn += constants.norm_cost + constants.gradient_cost(grad_std)
    chi2 = float(np.sum(np.square(z_norm)))
    assert stats.chi2.sf(chi2, len(z_norm)) > 1e-4 and stats.chi2.cdf(chi2, len(z_norm)) > 1e-4
    _assert_standard_normal(np.concatenate(z_grad))
    assert drawn <= rho * (1 + 1e-9)
    charged = _zcdp_total(job.plan.event_for(job.noise_multiplier, result.steps_run))
    assert drawn <= charged * (1 + 1e-9) and charged - drawn <= rho / BUDGET_UNITS
    last = constants.norm_cost + constants.gradient_cost(gradients[-1][3])
    assert gradients[-1][3] == constants.floor_noise or drawn - last <= rho / 2  # floor stop or filter


# ----------------------------------------------------------------------------- sensitivities


def _rows(seed: int, n: int, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=g), torch.randn(n, generator=g)


def _batch(X: torch.Tensor, y: torch.Tensor, L0: float) -> FullBatch:
    return FullBatch(
        X=X,
        y=y,
        loss="mse",
        lipschitz=L0,
        normaliser=50.0,
        max_physical_batch_size=7,
        generator=torch.Generator().manual_seed(0),
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
    )


def _flat(d: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in d.values()]).double()


def test_clipped_difference_matches_a_per_example_loop_and_is_bounded_by_C_under_add_remove() -> None:
    X, y = _rows(0, 30, 4)
    adversary_x, adversary_y = torch.full((1, 4), 1e3), torch.tensor([-1e4])  # a huge gradient
    model = _model("regression", 4)
    old = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    new = old + 0.3
    L0, C = 2.0, 0.05
    assign_flat(model, new)
    total = _flat(_batch(X, y, L0).clipped_difference_sum(model, old, clip=C))

    def clipped(point: torch.Tensor, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        probe = _model("regression", 4)
        assign_flat(probe, point)
        g = _flat(next(iter_per_sample_grads(probe, x[None], target[None], loss="mse", max_physical_batch_size=1)))
        return g * min(1.0, L0 / float(g.norm()))

    reference = torch.zeros_like(total)
    for i in range(30):
        diff = clipped(new, X[i], y[i]) - clipped(old, X[i], y[i])
        reference += diff * min(1.0, C / float(diff.norm()))
    torch.testing.assert_close(total, reference, rtol=1e-5, atol=1e-6)
    added = _flat(
        _batch(torch.cat([X, adversary_x]), torch.cat([y, adversary_y]), L0).clipped_difference_sum(model, old, clip=C)
    )
    assert float((added - total).norm()) <= C * (1 + 1e-5)  # Δ(D) = C/n on the average


def test_gradient_and_norm_releases_move_by_at_most_L0_when_a_row_is_added() -> None:
    X, y = _rows(1, 40, 6)
    model = _model("regression", 6)
    L0 = 0.5
    base = _flat(_batch(X, y, L0).clipped_sum(model))
    added = _flat(
        _batch(torch.cat([X, torch.full((1, 6), 50.0)]), torch.cat([y, torch.tensor([-80.0])]), L0).clipped_sum(model)
    )
    assert float((added - base).norm()) <= L0 * (1 + 1e-5)
    assert abs(float(added.norm()) - float(base.norm())) <= L0 * (1 + 1e-5)


# ----------------------------------------------------------------------------- Spider invariants


def test_spider_steps_have_length_r_k_rounds_restart_and_stay_in_the_lemma_1_ball() -> None:
    job, schedule, X, y = _spider_job()
    releases, result, _ = _run(job, X, y)
    kinds = [r[0] for r in releases]
    assert kinds.count("round-start") == schedule.K  # no cap hit: every round starts
    start = releases[0][1]
    radius = sum(r.steps * r.step_length for r in schedule.rounds)
    in_round = 0
    for (_, prev_point, _, _), (kind, point, _, std) in itertools.pairwise(releases):
        assert float((point - start).norm()) <= radius * (1 + 1e-9)
        if kind == "round-start":
            in_round = 0
            continue
        in_round += 1
        rnd = next(r for r in schedule.rounds if r.difference_noise == std)
        assert in_round <= rnd.differences
        assert float((point - prev_point).norm()) == pytest.approx(rnd.step_length, rel=1e-5)
    assert 0 < result.steps_run <= BUDGET_UNITS


def test_spider_is_a_no_op_when_the_target_is_already_met(caplog: pytest.LogCaptureFixture) -> None:
    """log F0 + κ log(n√ρ/(γL0√d)) ≤ 0: w0 is returned, nothing is spent, and the user is warned."""
    job = _plan("kl-spider", {"L0": 50.0, "gamma": 1.0, "kappa": 2.0, "F0": 1e-3}, epsilon=0.5)
    with caplog.at_level("WARNING"):
        releases, result, _ = _run(job, *_zero_data())
    assert releases == [] and result.steps_run == 0 and not result.stopped_early
    assert "nothing is run" in caplog.text


def test_a_vacuous_spider_schedule_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    job = _plan("kl-spider", {"L0": 1.0, "gamma": 1.0, "kappa": 1.5}, epsilon=1.0, steps=3)
    with caplog.at_level("WARNING"):
        _run(job, *_zero_data())
    assert "vacuous" in caplog.text


# ----------------------------------------------------------------------------- resume and cancel


ALGORITHMS = {
    "kl-spider": (SPIDER_HYPER, 60.0, 10_000),
    "adaptive-noisy-gd": ({"L0": 1.0, "L1": 1.5}, 3.0, 500),
    "noisy-gd": ({"L0": 1.0, "L1_tilde": 0.5}, 2.0, 30),
    "proximal-point": (
        {"L0": 1.0, "L1_tilde": 0.5, "kappa": 2.0, "gamma": 1.0, "F0": 1.0, "max_inner_steps": 4},
        4.0,
        30,
    ),
}


def _regression_job(name: str) -> tuple[JobPlan, torch.Tensor, torch.Tensor]:
    hyper, epsilon, steps = ALGORITHMS[name]
    job = _plan(name, hyper, n=SPIDER_N, features=SPIDER_FEATURES, task="regression", epsilon=epsilon, steps=steps)
    _, _, X, y = _spider_job()
    return job, X, y


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_resumed_run_is_identical_to_an_uninterrupted_one(name: str, tmp_path: Path) -> None:
    job, X, y = _regression_job(name)
    _, full, reference = _run(job, X, y)
    assert full.steps_run >= 4, "the run must span several checkpoints"

    saved: list[Path] = []

    def save(state: TrainingState) -> None:
        path = tmp_path / f"{len(saved)}.safetensors"
        save_training_state(path, state)  # through the real on-disk format
        saved.append(path)

    calls = {"n": 0}

    def stop_after_some_work() -> bool:
        calls["n"] += 1
        return calls["n"] > 6 and len(saved) >= 1

    hooks = TrainingHooks(should_stop=stop_after_some_work, save_checkpoint=save, checkpoint_every=1)
    _, interrupted, _ = _run(job, X, y, hooks=hooks)
    assert interrupted.stopped_early and saved
    state = load_training_state(saved[-1])
    _, resumed, model = _run(job, X, y, resume_from=state, seed=999)  # generator state is restored
    assert resumed.steps_run == full.steps_run and not resumed.stopped_early
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_cancelled_run_is_settled_with_a_charge_covering_what_ran(name: str) -> None:
    job, X, y = _regression_job(name)
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    releases, result, _ = _run(job, X, y, hooks=TrainingHooks(should_stop=stop))
    assert result.stopped_early and 0 < result.steps_run <= job.plan.steps
    assert len(releases) >= 3
    event = job.plan.event_for(job.noise_multiplier, result.steps_run)
    assert _zcdp_total(event) <= _zcdp_total(job.plan.event_for(job.noise_multiplier, job.plan.steps))


# ----------------------------------------------------------------------------- utility


def _least_squares(n: int, seed: int, d: int = 5) -> tuple[torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X = X / X.norm(dim=1, keepdim=True)
    w_true = torch.full((d,), 0.5, dtype=torch.float64)
    y = (X @ w_true + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)).clamp(-1, 1)
    A = torch.cat([X, torch.ones(n, 1, dtype=torch.float64)], dim=1)
    solution = torch.linalg.lstsq(A, y[:, None]).solution
    best = float(((A @ solution).squeeze(1) - y).pow(2).mean())
    return X.float(), y.float(), best


def _excess(name: str, hyper: dict[str, Any], n: int, seed: int, *, epsilon: float = 1.0, steps: int = 400) -> float:
    X, y, best = _least_squares(n, seed)
    job = _plan(name, hyper, n=n, features=5, task="regression", epsilon=epsilon, steps=steps)
    model = _model("regression", 5, seed=seed)
    with torch.no_grad():  # a public start far from w*
        model[-1].weight.zero_()
        model[-1].bias.zero_()
    get_trainer(name)(_request(job, model, X, y, seed=100 + seed))
    with torch.no_grad():
        risk = float((model(X).squeeze(-1).double() - y.double()).pow(2).mean())
    return risk - best


def test_adaptive_noisy_gd_excess_risk_on_least_squares_falls_with_n() -> None:
    """Excess risk against n at CI size (bench/kl_reproduction.py runs the larger sweep, with noisy GD)."""
    hyper = {"L0": 4.0, "L1": 2.0}
    small = np.median([_excess("adaptive-noisy-gd", hyper, 300, seed) for seed in range(3)])
    large = np.median([_excess("adaptive-noisy-gd", hyper, 4800, seed) for seed in range(3)])
    assert large < small / 3


def test_kl_spider_reaches_small_excess_risk_when_the_noise_is_negligible() -> None:
    """Non-private sanity: ε huge (σ tiny) on a PL least-squares problem (κ = 2)."""
    hyper = {"L0": 4.0, "L1": 2.0, "gamma": 3.0, "kappa": 2.0, "F0": 0.8}
    excess = _excess("kl-spider", hyper, 200, 0, epsilon=90.0, steps=400)
    _, y, best = _least_squares(200, 0)
    start = float(y.double().pow(2).mean()) - best
    assert excess < start / 20


@pytest.mark.parametrize("name", ["kl-spider", "adaptive-noisy-gd", "proximal-point"])
def test_the_pass_cap_bounds_the_work_and_progress_reports_the_units_spent(name: str) -> None:
    hyper, epsilon, _ = ALGORITHMS[name]
    job = _plan(name, hyper, n=SPIDER_N, features=SPIDER_FEATURES, task="regression", epsilon=epsilon, steps=5)
    _, _, X, y = _spider_job()
    seen: list[int] = []
    releases, result, _ = _run(job, X, y, hooks=TrainingHooks(on_step_end=seen.append))
    passes = sum(2 if kind == "difference" else 1 for kind, *_ in releases if kind != "norm")
    assert 1 <= passes <= 5 and not result.stopped_early
    assert seen == sorted(seen) and seen[-1] == result.steps_run
