"""Synthetic data of the heavy-tailed DP-SCO paper's experiments (its §6;
docs/reproductions.md#heavy-tailed-high-dimensional-dp-sco-hu-ni-xiao-wang--reproductions).

Conventions where the paper is ambiguous: "N(0, v)" and "Lognormal(0, σ²)" take VARIANCES
(numpy's lognormal gets σ = √σ²); log-gamma(c) is scipy's ``loggamma``; log-logistic(c) is
scipy's ``fisk`` (no finite mean for c = 0.1 — it violates Assumption 3); logistic(u, s) and
Laplace(5) are numpy's. Every generator takes a ``numpy.random.Generator``; nothing here touches the
service, so these are public synthetic data for tests and reproductions only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "FEATURES",
    "NOISES",
    "LinearProblem",
    "excess_risk_linear",
    "few_spike_l1",
    "linear_problem",
    "logistic_problem",
    "second_moment",
    "sparse_l2",
]

Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]

FEATURES: dict[str, Sampler] = {
    "lognormal": lambda rng, shape: rng.lognormal(0.0, math.sqrt(0.6), size=shape),  # Fig 1, 2, 5
    "student_t": lambda rng, shape: rng.standard_t(10, size=shape),  # Fig 6
    "normal": lambda rng, shape: rng.normal(0.0, math.sqrt(5.0), size=shape),  # Fig 7–10
    "laplace": lambda rng, shape: rng.laplace(0.0, 5.0, size=shape),  # Fig 11
    "gaussian_unit": lambda rng, shape: rng.normal(size=shape),  # tests
}

NOISES: dict[str, Sampler] = {
    "normal": lambda rng, shape: rng.normal(0.0, math.sqrt(0.1), size=shape),  # Fig 1, 5, 6
    "lognormal": lambda rng, shape: rng.lognormal(0.0, math.sqrt(0.5), size=shape),  # Fig 7
    "loglogistic": lambda rng, shape: stats.fisk(0.1).rvs(size=shape, random_state=rng),  # Fig 8
    "loggamma": lambda rng, shape: stats.loggamma(0.5).rvs(size=shape, random_state=rng),  # Fig 9, 11
    "logistic": lambda rng, shape: rng.logistic(0.0, 0.5, size=shape),  # Fig 10 (text)
    "none": lambda rng, shape: np.zeros(shape),
}


def second_moment(features: str, d: int) -> np.ndarray:
    """E[xxᵀ] of i.i.d. features, in closed form."""
    if features == "lognormal":
        s2 = 0.6
        return (math.exp(s2) - 1) * math.exp(s2) * np.eye(d) + math.exp(s2) * np.ones((d, d))
    variance = {"student_t": 10 / 8, "normal": 5.0, "laplace": 2 * 25.0, "gaussian_unit": 1.0}[features]
    return variance * np.eye(d)


def few_spike_l1(rng: np.random.Generator, d: int, spikes: int = 2) -> np.ndarray:
    """w* with ``spikes`` entries ±1/spikes: ‖w*‖₁ = 1, informative (a dense w* of ℓ1 norm 1 has so
    small an ℓ2 norm that w = 0 is already near-optimal)."""
    w = np.zeros(d)
    support = rng.choice(d, size=spikes, replace=False)
    w[support] = rng.choice([-1.0, 1.0], size=spikes) / spikes
    return w


def sparse_l2(rng: np.random.Generator, d: int, s_star: int, norm: float = 1.0) -> np.ndarray:
    """N(0, 100²) on s* random coordinates, projected to the ℓ2 sphere of radius ``norm``."""
    w = np.zeros(d)
    support = rng.choice(d, size=s_star, replace=False)
    w[support] = rng.normal(0.0, 100.0, size=s_star)
    return w * (norm / np.linalg.norm(w))


@dataclass(frozen=True)
class LinearProblem:
    X: np.ndarray
    y: np.ndarray
    w_star: np.ndarray
    features: str


def linear_problem(rng: np.random.Generator, *, n: int, w_star: np.ndarray, features: str, noise: str) -> LinearProblem:
    """y = ⟨w*, x⟩ + ι with i.i.d. feature coordinates and i.i.d. noise."""
    X = FEATURES[features](rng, (n, w_star.size))
    y = X @ w_star + NOISES[noise](rng, (n,))
    return LinearProblem(X=X, y=y, w_star=w_star, features=features)


def logistic_problem(
    rng: np.random.Generator, *, n: int, w_star: np.ndarray, features: str, noise: str
) -> LinearProblem:
    """y = sign(⟨x, w*⟩ + ζ) ∈ {−1, +1}."""
    X = FEATURES[features](rng, (n, w_star.size))
    z = X @ w_star + NOISES[noise](rng, (n,))
    return LinearProblem(X=X, y=np.where(z >= 0, 1.0, -1.0), w_star=w_star, features=features)


def excess_risk_linear(w: np.ndarray, w_star: np.ndarray, features: str) -> float:
    """L(w) − L(w*) = (w − w*)ᵀ E[xxᵀ] (w − w*) for the squared loss without ½."""
    diff = np.asarray(w, dtype=np.float64) - w_star
    return float(diff @ second_moment(features, diff.size) @ diff)
