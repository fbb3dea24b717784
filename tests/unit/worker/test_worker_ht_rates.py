"""Statistical rate tests of the heavy-tailed family, with tolerances from small
preliminary replications of the paper's experiments. Slow (minutes): marked ``slow`` and run only with
PRIVTRAIN_RUN_SLOW=1, outside CI:

    PRIVTRAIN_RUN_SLOW=1 .venv/bin/python -m pytest tests/unit/worker/test_worker_ht_rates.py -q -p no:cacheprovider
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from bench.ht_data import excess_risk_linear, few_spike_l1, linear_problem, logistic_problem, sparse_l2
from bench.ht_figures import fw_tau
from bench.ht_runner import run_private

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("PRIVTRAIN_RUN_SLOW") != "1", reason="slow rate test: set PRIVTRAIN_RUN_SLOW=1"),
]


def _alg3_error(n: int, eps: float, seed: int, *, s_star: int = 5) -> tuple[float, float]:
    """Setup: x ~ N(0, 5I), lognormal(σ = 0.5) noise, d = 200, s = 2s*, T = ⌊ln n⌋, η₀ = 0.1."""
    w_star = sparse_l2(np.random.default_rng(100 + seed), 200, s_star)
    rng = np.random.default_rng(seed)
    X = rng.normal(0, math.sqrt(5), size=(n, 200))
    y = X @ w_star + rng.lognormal(0, 0.5, size=n)
    hyper = {
        "preset": "paper-experiments",
        "s_star": s_star,
        "gamma": 5.0,
        "mu": 5.0,
        "eta": 0.5,
        "design_epsilon": eps,
    }
    w = run_private(
        "ht-sparse-linreg", hyper, X, y, task="regression", target_epsilon=eps, delta=n**-1.1, seed=seed
    ).weights
    recall = len(set(np.flatnonzero(w)) & set(np.flatnonzero(w_star))) / s_star
    return float(np.sum((w - w_star) ** 2)), recall


def test_s2_alg3_rate_in_n_eps_and_sparsity() -> None:
    small = np.mean([_alg3_error(50_000, 10.0, seed)[0] for seed in range(3)])
    large_runs = [_alg3_error(200_000, 10.0, seed) for seed in range(3)]
    large = np.mean([e for e, _ in large_runs])
    assert large <= 0.45 * small
    assert large < 0.05 and np.mean([r for _, r in large_runs]) >= 0.6
    by_eps = [np.mean([_alg3_error(50_000, eps, seed)[0] for seed in range(3)]) for eps in (1.0, 3.0, 10.0)]
    assert by_eps[0] > by_eps[1] > by_eps[2]
    assert np.mean([_alg3_error(50_000, 1.0, s, s_star=20)[0] for s in range(3)]) > by_eps[0]


def _alg1_risk(n: int, eps: float, seed: int, d: int = 200) -> float:
    w_star = few_spike_l1(np.random.default_rng(7), d)
    tau = fw_tau(d, w_star)
    p = linear_problem(np.random.default_rng(seed), n=n, w_star=w_star, features="lognormal", noise="normal")
    w = run_private(
        "ht-dp-fw",
        {"tau": tau, "design_epsilon": eps},
        p.X,
        p.y,
        task="regression",
        target_epsilon=eps,
        delta=n**-1.1,
        seed=seed,
    ).weights
    return excess_risk_linear(w, w_star, "lognormal")


def test_s4_alg1_rate_and_dimension_insensitivity() -> None:
    ns = [10_000, 30_000, 90_000]
    risks = [np.mean([_alg1_risk(n, 10.0, seed) for seed in range(3)]) for n in ns]
    assert risks[2] <= 0.6 * risks[0]
    slope = np.polyfit(np.log(ns), np.log(risks), 1)[0]
    assert slope <= -0.2
    low = np.mean([_alg1_risk(30_000, 1.0, seed, d=200) for seed in range(3)])
    high = np.mean([_alg1_risk(30_000, 1.0, seed, d=800) for seed in range(3)])
    assert high / low <= 1.5


def test_s5_alg2_error_decreases_in_n() -> None:
    def risk(n: int, seed: int) -> float:
        w_star = few_spike_l1(np.random.default_rng(7), 200)
        p = linear_problem(np.random.default_rng(seed), n=n, w_star=w_star, features="lognormal", noise="normal")
        w = run_private(
            "ht-private-lasso",
            {"preset": "paper-experiments", "design_epsilon": 10.0},
            p.X,
            p.y,
            task="regression",
            target_epsilon=10.0,
            delta=n**-1.1,
            seed=seed,
        ).weights
        return excess_risk_linear(w, w_star, "lognormal")

    assert np.mean([risk(100_000, s) for s in range(3)]) < np.mean([risk(10_000, s) for s in range(3)])


def test_s3_alg5_logistic_held_out_risk_decreases_in_n() -> None:
    w_star = sparse_l2(np.random.default_rng(11), 200, 5)
    test = logistic_problem(np.random.default_rng(99), n=200_000, w_star=w_star, features="gaussian_unit", noise="none")

    def held_out_risk(n: int, seed: int) -> float:
        p = logistic_problem(
            np.random.default_rng(seed), n=n, w_star=w_star, features="gaussian_unit", noise="logistic"
        )
        w = run_private(
            "ht-sparse-opt",
            {"s_star": 5, "design_epsilon": 10.0},
            p.X,
            ((p.y + 1) / 2).astype(np.int64),
            task="classification",
            target_epsilon=10.0,
            delta=n**-1.1,
            seed=seed,
        ).weights
        return float(np.mean(np.logaddexp(0.0, -test.y * (test.X @ w))))

    assert np.mean([held_out_risk(200_000, s) for s in range(2)]) < np.mean(
        [held_out_risk(20_000, s) for s in range(2)]
    )
