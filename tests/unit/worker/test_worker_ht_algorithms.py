"""The heavy-tailed family's loops and trainers: sensitivity (U4/U5), data usage (U9), invariants
(U10), non-private limits (S1), robustness (S6) and the noise the trainers really draw."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from algorithms import get_algorithm
from algorithms.ht_dpsco import calibration as cal
from algorithms.ht_dpsco import loops
from algorithms.ht_dpsco import trainer as trainers
from algorithms.ht_dpsco.loops import (
    FWConfig,
    LassoConfig,
    RowAccess,
    SparseLinRegConfig,
    SparseOptConfig,
    fw_gradient_estimate,
    lasso_gradient,
    linreg_half_step,
    sparse_opt_half_step,
)
from algorithms.ht_dpsco.mechanisms import Polytope
from algorithms.trainers import TrainingRequest, get_trainer
from bench.ht_data import few_spike_l1, linear_problem
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.datasets.facts import DatasetFacts
from kernel.schemas.jobs import TrainingSpec
from privtrain_common.zoo.architectures import build_model

ADVERSARIAL = [1e300, -1e300, 1e8, -1e8, 0.0]


def _gen(seed: int = 0) -> SecureRandom:
    return SecureRandom.from_seed(seed)


def _data(n: int = 600, d: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    X = torch.from_numpy(rng.standard_t(3, size=(n, d)))
    y = torch.from_numpy(rng.standard_t(3, size=n))
    return X, y


def _random_l1(rng: np.random.Generator, d: int, r: float) -> torch.Tensor:
    w = rng.dirichlet(np.ones(d + 1))[:d] * rng.choice([-1, 1], size=d) * r
    return torch.from_numpy(w)


def _sparse_unit(rng: np.random.Generator, d: int, s: int, R: float) -> torch.Tensor:
    w = np.zeros(d)
    w[rng.choice(d, s, replace=False)] = rng.normal(size=s)
    return torch.from_numpy(w / np.linalg.norm(w) * R)


def _neighbours(X: torch.Tensor, y: torch.Tensor, value: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """D with one extra adversarial row (add/remove neighbour)."""
    row = torch.full((1, X.shape[1]), value, dtype=torch.float64)
    return [
        (torch.cat([X, row]), torch.cat([y, torch.tensor([value], dtype=torch.float64)])),
        (torch.cat([X, -row]), torch.cat([y, torch.tensor([value], dtype=torch.float64)])),
    ]


# ----------------------------------------------------------------------------- U4/U5 sensitivity


def test_lasso_gradient_add_remove_sensitivity() -> None:
    X, y = _data()
    K, r, n = 2.0, 1.5, float(X.shape[0])
    bound = cal.lasso_gradient_sensitivity(truncation=K, radius=r, n=n)
    rng = np.random.default_rng(1)
    for _ in range(10):
        w = _random_l1(rng, X.shape[1], r)
        base = lasso_gradient(X, y, w, truncation=K, normaliser=n)
        for value in ADVERSARIAL:
            for Xn, yn in _neighbours(X, y, value):
                moved = lasso_gradient(Xn, yn, w, truncation=K, normaliser=n) - base
                assert float(moved.abs().max()) <= bound + 1e-12


def test_linreg_half_step_add_remove_sensitivity() -> None:
    X, y = _data()
    s, R = 4, 1.0
    config = SparseLinRegConfig(
        iterations=1,
        block_size=100.0,
        sparsity=s,
        truncation=1.7,
        step=0.3,
        radius=R,
        laplace_scale=1.0,
        sensitivity=1.0,
    )
    bound = cal.linreg_sensitivity(truncation=1.7, step=0.3, sparsity=s, radius=R, block_size=100.0)
    rng = np.random.default_rng(2)
    for _ in range(10):
        w = _sparse_unit(rng, X.shape[1], s, R)
        base = linreg_half_step(X, y, w, config)
        for value in ADVERSARIAL:
            for Xn, yn in _neighbours(X, y, value):
                assert float((linreg_half_step(Xn, yn, w, config) - base).abs().max()) <= bound + 1e-12


@pytest.mark.parametrize("loss", ["logistic", "half_squared"])
def test_sparse_opt_half_step_add_remove_sensitivity(loss: str) -> None:
    X, y = _data()
    if loss == "logistic":
        y = torch.sign(y) + (y == 0)
    config = SparseOptConfig(
        iterations=1,
        block_size=80.0,
        sparsity=3,
        scale=0.7,
        beta=1.0,
        step=0.4,
        loss=loss,
        laplace_scale=1.0,
        sensitivity=1.0,
        term_bound=cal.PHI_BOUND,
        l2=0.01,
    )
    tight = cal.sparse_opt_sensitivity(scale=0.7, step=0.4, block_size=80.0, box=False)
    w = torch.zeros(X.shape[1], dtype=torch.float64)
    w[[1, 5]] = torch.tensor([3.0, -2.0], dtype=torch.float64)
    base = sparse_opt_half_step(X, y, w, config)
    for value in ADVERSARIAL + [float("inf"), float("nan")]:
        for Xn, yn in _neighbours(X, y, value):
            assert float((sparse_opt_half_step(Xn, yn, w, config) - base).abs().max()) <= tight + 1e-12


def test_fw_estimate_add_remove_sensitivity() -> None:
    X, y = _data()
    config = FWConfig(
        polytope=Polytope("l1_ball", 1.0, X.shape[1]),
        iterations=1,
        block_size=50.0,
        kappa=2.0,
        beta=1.0,
        loss="squared",
        epsilon_step=1.0,
        score_sensitivity=1.0,
        term_bound=cal.PHI_BOUND,
    )
    bound = cal.robust_mean_sensitivity(kappa=2.0, block_size=50.0)
    w = _random_l1(np.random.default_rng(3), X.shape[1], 1.0)
    base = fw_gradient_estimate(X, y, w, config)
    for value in ADVERSARIAL + [float("inf")]:
        for Xn, yn in _neighbours(X, y, value):
            assert float((fw_gradient_estimate(Xn, yn, w, config) - base).abs().max()) <= bound + 1e-12


# ----------------------------------------------------------------------------- U9 data usage


class RecordingRows(RowAccess):
    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        super().__init__(X, y)
        self.reads: list[list[int]] = []

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads.append(index.tolist())
        return super().take(index)


def _configs(d: int, T: int) -> dict[str, Any]:
    return {
        "fw": (
            loops.run_ht_frank_wolfe,
            FWConfig(
                polytope=Polytope("l1_ball", 1.0, d),
                iterations=T,
                block_size=40.0,
                kappa=1.0,
                beta=1.0,
                loss="squared",
                epsilon_step=1.0,
                score_sensitivity=0.1,
                term_bound=cal.PHI_BOUND,
            ),
        ),
        "linreg": (
            loops.run_ht_sparse_linreg,
            SparseLinRegConfig(
                iterations=T,
                block_size=40.0,
                sparsity=3,
                truncation=2.0,
                step=0.5,
                radius=1.0,
                laplace_scale=0.01,
                sensitivity=0.01,
            ),
        ),
        "opt": (
            loops.run_ht_sparse_opt,
            SparseOptConfig(
                iterations=T,
                block_size=40.0,
                sparsity=3,
                scale=1.0,
                beta=1.0,
                step=0.5,
                loss="half_squared",
                laplace_scale=0.01,
                sensitivity=0.01,
                term_bound=cal.PHI_BOUND,
            ),
        ),
    }


@pytest.mark.parametrize("which", ["fw", "linreg", "opt"])
def test_block_algorithms_read_each_row_exactly_once(which: str) -> None:
    X, y = _data(n=400)
    run, config = _configs(X.shape[1], 10)[which]
    rows = RecordingRows(X, y)
    outcome = run(rows, config, generator=_gen(), hooks=TrainingHooks())
    assert outcome.steps_run == 10 and len(rows.reads) == 10
    flat = [i for block in rows.reads for i in block]
    assert sorted(flat) == list(range(400))  # disjoint, and every row is in one block
    assert min(len(block) for block in rows.reads) > 15  # Binomial(400, 1/10) blocks


def test_block_split_is_identical_for_a_dataset_with_one_more_row() -> None:
    X, y = _data(n=400)
    run, config = _configs(X.shape[1], 10)["linreg"]
    small, large = RecordingRows(X[:399], y[:399]), RecordingRows(X, y)
    run(small, config, generator=_gen(5), hooks=TrainingHooks())
    run(large, config, generator=_gen(5), hooks=TrainingHooks())
    changed = [i for i, (a, b) in enumerate(zip(small.reads, large.reads, strict=True)) if a != b]
    assert len(changed) == 1 and set(large.reads[changed[0]]) - set(small.reads[changed[0]]) == {399}


def test_lasso_uses_every_row_in_every_iteration_and_stops_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """All rows are read (once, then clipped) and each iteration's gradient is over all of them:
    dropping any one row changes every iteration's gradient."""
    X, y = _data(n=100)
    rows = RecordingRows(X, y)
    config = LassoConfig(
        polytope=Polytope("l1_ball", 1.0, X.shape[1]),
        iterations=6,
        normaliser=100.0,
        truncation=2.0,
        epsilon_step=1.0,
        score_sensitivity=0.1,
    )
    stop_after = {"n": 0}

    def should_stop() -> bool:
        return stop_after["n"] >= 4

    def on_step_end(step: int) -> None:
        stop_after["n"] = step

    outcome = loops.run_ht_private_lasso(
        rows, config, generator=_gen(), hooks=TrainingHooks(on_step_end=on_step_end, should_stop=should_stop)
    )
    assert outcome.stopped_early and outcome.steps_run == 4
    assert rows.reads == [list(range(100))]
    seen: list[torch.Tensor] = []
    real = loops._squared_loss_gradient

    def spy(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, *, normaliser: float) -> torch.Tensor:
        seen.append(X)
        return real(X, y, w, normaliser=normaliser)

    monkeypatch.setattr(loops, "_squared_loss_gradient", spy)
    loops.run_ht_private_lasso(RowAccess(X, y), config, generator=_gen(), hooks=TrainingHooks())
    assert len(seen) == 6 and all(part.shape[0] == 100 for part in seen)


# ----------------------------------------------------------------------------- U10, S6 invariants


def test_iterates_stay_feasible_even_on_contaminated_data() -> None:
    X, y = _data(n=500)
    X[::100] = 1e8
    y[::100] = -1e8
    for seed in range(3):
        for which, (run, config) in _configs(X.shape[1], 8).items():
            w = run(RowAccess(X, y), config, generator=_gen(seed), hooks=TrainingHooks()).weights
            assert bool(torch.isfinite(w).all())
            if which == "fw":
                assert float(w.abs().sum()) <= 1.0 + 1e-12
            else:
                assert int((w != 0).sum()) <= 3
            if which == "linreg":
                assert float(torch.linalg.vector_norm(w)) <= 1.0 + 1e-12


# ----------------------------------------------------------------------------- S1 non-private limits


def test_alg3_without_noise_or_truncation_is_iht_and_recovers_the_support() -> None:
    rng = np.random.default_rng(7)
    w_star = np.zeros(200)
    w_star[rng.choice(200, 5, replace=False)] = rng.choice([-0.2, 0.2], size=5)  # ‖w*‖₂ ≈ 0.45 ≤ ½ (Thm 7)
    problem = linear_problem(rng, n=5000, w_star=w_star, features="gaussian_unit", noise="normal")
    config = SparseLinRegConfig(
        iterations=10,
        block_size=500.0,
        sparsity=5,
        truncation=1e12,
        step=0.9,
        radius=1.0,
        laplace_scale=1e-12,
        sensitivity=1e-12,
    )
    data = RowAccess(torch.from_numpy(problem.X), torch.from_numpy(problem.y))
    w = loops.run_ht_sparse_linreg(data, config, generator=_gen(), hooks=TrainingHooks()).weights
    assert set(np.flatnonzero(w.numpy())) == set(np.flatnonzero(w_star))
    assert float(np.sum((w.numpy() - w_star) ** 2)) < 1e-2
    plain = torch.zeros(200, dtype=torch.float64)  # plain IHT on the same blocks
    for index in loops._blocks(data, 10, _gen()):
        half = plain - 0.9 * data.X[index].T @ (data.X[index] @ plain - data.y[index]) / 500.0
        keep = torch.topk(half.abs(), 5).indices
        plain = torch.zeros_like(half)
        plain[keep] = half[keep]
        plain = plain / max(1.0, float(torch.linalg.vector_norm(plain)))
    assert torch.allclose(w, plain, atol=1e-9)


def test_alg1_without_noise_or_truncation_is_plain_frank_wolfe_on_the_same_blocks() -> None:
    rng = np.random.default_rng(8)
    problem = linear_problem(rng, n=3000, w_star=few_spike_l1(rng, 30), features="lognormal", noise="normal")
    X, y = torch.from_numpy(problem.X), torch.from_numpy(problem.y)
    T, d = 12, 30
    config = FWConfig(
        polytope=Polytope("l1_ball", 1.0, d),
        iterations=T,
        block_size=250.0,
        kappa=1e12,
        beta=1.0,
        loss="squared",
        epsilon_step=1e9,
        score_sensitivity=1.0,
        term_bound=cal.PHI_BOUND,
    )
    w = loops.run_ht_frank_wolfe(RowAccess(X, y), config, generator=_gen(3), hooks=TrainingHooks()).weights
    blocks = loops._blocks(RowAccess(X, y), T, _gen(3))
    plain = torch.zeros(d, dtype=torch.float64)
    for t, index in enumerate(blocks):
        gradient = (2 * (X[index] @ plain - y[index])[:, None] * X[index]).sum(0) / 250.0
        j = int(torch.argmax(gradient.abs()))
        vertex = torch.zeros(d, dtype=torch.float64)
        vertex[j] = -torch.sign(gradient[j])
        plain = (1 - 2 / (t + 3)) * plain + 2 / (t + 3) * vertex
    assert torch.allclose(w, plain, atol=1e-9)


# ----------------------------------------------------------------------------- trainers


def _request(
    name: str,
    hyperparameters: dict,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    task: str,
    sigma: float,
    steps: int | None = None,
    seed: int = 0,
) -> tuple[TrainingRequest, Any]:
    n, d = X.shape
    classes = 2 if task == "classification" else None
    facts = DatasetFacts(n_rows=n, feature_shape=(d,), task=task, n_classes=classes)
    algorithm = get_algorithm(name)
    training = algorithm.accept_training(TrainingSpec(steps=steps, epochs=None if steps else 1), facts)
    hyper = algorithm.validate_hyperparameters(hyperparameters)
    plan = algorithm.plan(hyper, training, facts)
    model = build_model(
        "linear-regression" if classes is None else "logistic-regression", {}, input_shape=(d,), n_outputs=classes or 1
    )
    request = TrainingRequest(
        model=model,
        features=TensorRows(X.float()),
        y=y,
        task=task,
        hyperparameters=hyper,
        training=training,
        noise_multiplier=sigma,
        sampling_probability=plan.sampling_probability,
        expected_batch_size=plan.expected_batch_size,
        steps=plan.steps,
        max_physical_batch_size=256,
        generator=_gen(seed),
        hooks=TrainingHooks(),
        resume_from=None,
        device=torch.device("cpu"),
    )
    return request, plan


@pytest.mark.parametrize(
    ("name", "runner", "hyper"),
    [
        ("ht-dp-fw", "run_ht_frank_wolfe", {"constraint": "simplex"}),
        ("ht-private-lasso", "run_ht_private_lasso", {}),
        ("ht-sparse-linreg", "run_ht_sparse_linreg", {}),
        ("ht-sparse-opt", "run_ht_sparse_opt", {"sensitivity_mode": "tight"}),
    ],
)
def test_trainers_use_exactly_the_charged_noise(
    monkeypatch: pytest.MonkeyPatch, name: str, runner: str, hyper: dict
) -> None:
    """ε_step = 1/σ with the planned Δ (exponential mechanism), b = σ·λ (Peeling)."""
    X, y = _data(n=800)
    request, plan = _request(name, hyper, X, y, task="regression", sigma=0.37)
    seen: dict[str, Any] = {}
    real = getattr(trainers, runner)

    def spy(data: RowAccess, config: Any, **kwargs: Any) -> Any:
        seen["config"] = config
        return real(data, config, **kwargs)

    monkeypatch.setattr(trainers, runner, spy)
    result = get_trainer(name)(request)
    assert result.steps_run == plan.steps and not result.stopped_early
    config = seen["config"]
    if hasattr(config, "epsilon_step"):
        assert config.epsilon_step == pytest.approx(1 / 0.37, rel=1e-15)
        assert config.score_sensitivity == pytest.approx(plan.sensitivity, rel=1e-12)
    else:
        assert config.laplace_scale == pytest.approx(0.37 * plan.sensitivity, rel=1e-12)
    normaliser = getattr(config, "block_size", getattr(config, "normaliser", None))
    assert normaliser == pytest.approx(plan.expected_batch_size, rel=1e-12)


def test_peeling_noise_actually_released_has_the_charged_scale() -> None:
    """All-zero data and T = 1: the output is exactly the Laplace(σ·λ) release noise on s
    coordinates, so its mean absolute value estimates the scale b that was charged."""
    d, n, sigma = 200, 400, 0.5
    X = torch.zeros(n, d, dtype=torch.float64)
    y = torch.zeros(n, dtype=torch.float64)
    hyper = {"sparsity": 200, "radius": 1e6}
    values = []
    plan = None
    for seed in range(5):
        request, plan = _request("ht-sparse-linreg", hyper, X, y, task="regression", sigma=sigma, steps=1, seed=seed)
        get_trainer("ht-sparse-linreg")(request)
        values.append(request.model[1].weight.detach().double().flatten())
    assert plan is not None
    b = sigma * plan.sensitivity
    assert float(torch.cat(values).abs().mean()) == pytest.approx(b, rel=0.1)


def test_logistic_model_predicts_sigmoid_of_w_x() -> None:
    rng = np.random.default_rng(4)
    X = torch.from_numpy(rng.normal(size=(300, 6)))
    y = (X[:, 0] > 0).long()
    request, _ = _request("ht-sparse-opt", {"s_star": 1}, X, y, task="classification", sigma=0.01)
    get_trainer("ht-sparse-opt")(request)
    layer = request.model[1]
    w = (layer.weight[1] - layer.weight[0]).detach()
    probabilities = torch.softmax(request.model(X.float()), dim=1)[:, 1]
    assert torch.allclose(probabilities, torch.sigmoid(X.float() @ w), atol=1e-6)
    assert float(w[0]) > 0 and int((w != 0).sum()) <= 2


# ----------------------------------------------------------------------------- T14


class DeviceNoise:
    """The same CPU noise stream, delivered on ``target``: identical draws on every backend."""

    def __init__(self, seed: int, target: torch.device) -> None:
        from algorithms.ht_dpsco.mechanisms import ExactNoise

        self.source = ExactNoise(SecureRandom.from_seed(seed))
        self.target = target

    def select_exponential(self, scores: torch.Tensor, *, epsilon: float, sensitivity: float) -> int:
        return self.source.select_exponential(scores.cpu(), epsilon=epsilon, sensitivity=sensitivity)

    def report_noisy_max(self, scores: torch.Tensor, *, scale: float, sensitivity: float) -> int:
        return self.source.report_noisy_max(scores.cpu(), scale=scale, sensitivity=sensitivity)

    def laplace_release(self, values: torch.Tensor, *, scale: float, sensitivity: float) -> torch.Tensor:
        return self.source.laplace_release(values.cpu(), scale=scale, sensitivity=sensitivity).to(self.target)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="T14: needs a CUDA device")
def test_cuda_iterates_agree_with_cpu_given_the_same_noise() -> None:
    X, y = _data(n=2000, d=30)
    for which, (run, config) in _configs(30, 8).items():
        outputs = []
        for device in (torch.device("cpu"), torch.device("cuda")):
            data = RowAccess(X.to(device), y.to(device))
            outcome = run(data, config, generator=_gen(1), hooks=TrainingHooks(), noise=DeviceNoise(2, device))
            outputs.append(outcome.weights.cpu())
        assert torch.allclose(outputs[0], outputs[1], atol=1e-9), which
