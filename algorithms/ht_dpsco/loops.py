"""The four loops of the heavy-tailed DP-SCO family (docs/algorithms/heavy-tailed-dpsco.md), in float64 on one device.

Alg 1, 3, 5 touch each training row in exactly one iteration (the block the job's generator
assigned it, :func:`assign_blocks`); Alg 2 uses every row in every iteration. Data access goes
through :class:`RowAccess.take` so tests can instrument it. Gradients of these GLM
losses are c_i·x_i with a scalar c_i per row, computed in closed form — no autograd
and no per-sample engine is needed for a linear predictor.

Each block's sum is divided by the PUBLIC expected block size m (or the public n for Alg 2),
never by the realised count (docs/privacy-model.md#neighbours). Nothing private is logged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from algorithms.ht_dpsco.mechanisms import (
    ExactNoise,
    NoiseSource,
    Polytope,
    assign_blocks,
    exponential_mechanism,
    peeling,
    project_l2_ball,
)
from algorithms.ht_dpsco.robust_mean import robust_mean_sum
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "LOSS_DERIVATIVES",
    "FWConfig",
    "LassoConfig",
    "LoopOutcome",
    "RowAccess",
    "SparseLinRegConfig",
    "SparseOptConfig",
    "per_sample_gradients",
    "run_ht_frank_wolfe",
    "run_ht_private_lasso",
    "run_ht_sparse_linreg",
    "run_ht_sparse_opt",
]

LossDerivative = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
LOSS_DERIVATIVES: dict[str, LossDerivative] = {}


def _loss(name: str) -> Callable[[LossDerivative], LossDerivative]:
    def register(function: LossDerivative) -> LossDerivative:
        LOSS_DERIVATIVES[name] = function
        return function

    return register


@_loss("squared")
def _squared(z: torch.Tensor, y: torch.Tensor, _c: float) -> torch.Tensor:
    """d/dz (z − y)²."""
    return 2.0 * (z - y)


@_loss("half_squared")
def _half_squared(z: torch.Tensor, y: torch.Tensor, _c: float) -> torch.Tensor:
    """d/dz ½(z − y)² (Alg 3 step 5; docs/algorithms/heavy-tailed-dpsco.md#paper-conventions)."""
    return z - y


@_loss("logistic")
def _logistic(z: torch.Tensor, y: torch.Tensor, _c: float) -> torch.Tensor:
    """d/dz ln(1 + e^{−yz}) = −y·σ(−yz), labels y ∈ {±1}."""
    return -y * torch.sigmoid(-y * z)


@_loss("biweight")
def _biweight(z: torch.Tensor, y: torch.Tensor, c: float) -> torch.Tensor:
    """ψ′(u) = u(1 − (u/c)²)² on |u| ≤ c, 0 outside (Thm 3), u = z − y."""
    u = z - y
    inside = u.abs() <= c
    return torch.where(inside, u * (1.0 - (u / c) ** 2) ** 2, torch.zeros_like(u))


def per_sample_gradients(
    loss: str, w: torch.Tensor, X: torch.Tensor, y: torch.Tensor, *, biweight_c: float = 1.0, l2: float = 0.0
) -> torch.Tensor:
    """Rows ∇_w ℓ(w, (x_i, y_i)) = c_i·x_i (+ λ₂w), shape (rows, d)."""
    c = LOSS_DERIVATIVES[loss](X @ w, y, biweight_c)
    grads = c[:, None] * X
    return grads + l2 * w[None, :] if l2 else grads


class RowAccess:
    """The training rows (float64, one device); every read goes through :meth:`take`."""

    def __init__(self, X: torch.Tensor, y: torch.Tensor) -> None:
        self.X = X
        self.y = y

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        return int(self.X.shape[1])

    def take(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.X[index], self.y[index]


@dataclass(frozen=True)
class LoopOutcome:
    weights: torch.Tensor
    steps_run: int
    stopped_early: bool


Update = Callable[[int, torch.Tensor], torch.Tensor]
"""Iteration t's step: w^t ↦ w^{t+1}."""


def _iterate(w: torch.Tensor, iterations: int, hooks: TrainingHooks, update: Update) -> LoopOutcome:
    """The family's one loop: ``iterations`` updates of w, a cancel honoured before each and the
    progress reported after each."""
    for t in range(iterations):
        if hooks.should_stop is not None and hooks.should_stop():
            return LoopOutcome(w, t, True)
        w = update(t, w)
        if hooks.on_step_end is not None:
            hooks.on_step_end(t + 1)
    return LoopOutcome(w, iterations, False)


def _over_blocks(
    data: RowAccess,
    w: torch.Tensor,
    iterations: int,
    *,
    generator: SecureRandom,
    hooks: TrainingHooks,
    update: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> LoopOutcome:
    """Alg 1, 3, 5: iteration t reads block t only, ``update(X_t, y_t, w, t)``."""
    blocks = _blocks(data, iterations, generator)
    return _iterate(w, iterations, hooks, lambda t, w: update(*data.take(blocks[t]), w, t))


def _frank_wolfe_step(
    w: torch.Tensor,
    gradient: torch.Tensor,
    t: int,
    *,
    polytope: Polytope,
    iterations: int,
    epsilon_step: float,
    score_sensitivity: float,
    noise: NoiseSource,
    selection: Literal["gumbel", "laplace-noisy-max"] = "gumbel",
    constant_step: bool = False,
) -> torch.Tensor:
    """Alg 1 / Alg 2: the exponential mechanism picks a vertex from g̃, then w moves toward it."""
    j = exponential_mechanism(
        polytope.scores(gradient),
        epsilon=epsilon_step,
        sensitivity=score_sensitivity,
        noise=noise,
        selection=selection,
    )
    step = fw_step_size(t, iterations, constant=constant_step)
    return (1.0 - step) * w + step * polytope.vertex(j, torch.float64, w.device)


def _clip(values: torch.Tensor, level: float) -> torch.Tensor:
    """Entrywise shrinkage to [−K, K] after NaN → 0."""
    return torch.nan_to_num(values, nan=0.0).clamp(-level, level)


def _blocks(data: RowAccess, iterations: int, generator: SecureRandom) -> list[torch.Tensor]:
    assignment = assign_blocks(data.n_rows, iterations, generator)
    order = torch.argsort(assignment, stable=True)
    counts = torch.bincount(assignment, minlength=iterations).tolist()
    return list(torch.split(order, counts))


# ============================================================================ Alg 1


@dataclass(frozen=True)
class FWConfig:
    polytope: Polytope
    iterations: int
    block_size: float
    kappa: float
    beta: float
    loss: str
    epsilon_step: float
    score_sensitivity: float
    term_bound: float
    """Bound on |ψ|/κ that score_sensitivity assumes (the catalogue's sup |φ|); terms are clipped to it."""
    constant_step: bool = False
    biweight_c: float = 4.685
    selection: Literal["gumbel", "laplace-noisy-max"] = "gumbel"


def fw_step_size(t: int, iterations: int, *, constant: bool) -> float:
    """η_{t−1} = 2/(t+2) for t = 1..T (0-based here: 2/(t+3)); constant 1/√T for Thm 3."""
    return 1.0 / math.sqrt(iterations) if constant else 2.0 / (t + 3.0)


def fw_gradient_estimate(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, config: FWConfig) -> torch.Tensor:
    """g̃ = (1/m)Σψ_κ(∇ℓ(w, z)) over the block, m the public expected block size."""
    grads = per_sample_gradients(config.loss, w, X, y, biweight_c=config.biweight_c)
    return (
        robust_mean_sum(grads, kappa=config.kappa, beta=config.beta, term_bound=config.term_bound) / config.block_size
    )


def run_ht_frank_wolfe(
    data: RowAccess,
    config: FWConfig,
    *,
    generator: SecureRandom,
    hooks: TrainingHooks,
    noise: NoiseSource | None = None,
) -> LoopOutcome:
    """Alg 1: robust mean of the block's per-sample gradients → exponential mechanism → FW step."""
    source = noise or ExactNoise(generator)

    def update(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, t: int) -> torch.Tensor:
        return _frank_wolfe_step(
            w,
            fw_gradient_estimate(X, y, w, config),
            t,
            polytope=config.polytope,
            iterations=config.iterations,
            epsilon_step=config.epsilon_step,
            score_sensitivity=config.score_sensitivity,
            noise=source,
            selection=config.selection,
            constant_step=config.constant_step,
        )

    start = config.polytope.start(torch.float64, data.X.device)
    return _over_blocks(data, start, config.iterations, generator=generator, hooks=hooks, update=update)


# ============================================================================ Alg 2


@dataclass(frozen=True)
class LassoConfig:
    polytope: Polytope
    iterations: int
    normaliser: float
    truncation: float
    epsilon_step: float
    score_sensitivity: float


def lasso_gradient(
    X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, *, truncation: float, normaliser: float
) -> torch.Tensor:
    """g̃ = (2/n)Σx̃(⟨x̃,w⟩ − ỹ) on entrywise-clipped data, n the public training-row count."""
    return _squared_loss_gradient(_clip(X, truncation), _clip(y, truncation), w, normaliser=normaliser)


def _squared_loss_gradient(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, *, normaliser: float) -> torch.Tensor:
    return 2.0 * (X.T @ (X @ w - y)) / normaliser


def run_ht_private_lasso(
    data: RowAccess,
    config: LassoConfig,
    *,
    generator: SecureRandom,
    hooks: TrainingHooks,
    noise: NoiseSource | None = None,
) -> LoopOutcome:
    """Alg 2: full-data gradient (2/n)Σx̃(⟨x̃,w⟩ − ỹ) of the clipped data → exp. mechanism → FW step.
    Every row enters every iteration's gradient; the data are read and clipped once (the clip is
    a fixed per-row map, so this is the same quantity)."""
    source = noise or ExactNoise(generator)
    X, y = data.take(torch.arange(data.n_rows, device=data.X.device))
    X, y = _clip(X, config.truncation), _clip(y, config.truncation)

    def update(t: int, w: torch.Tensor) -> torch.Tensor:
        return _frank_wolfe_step(
            w,
            _squared_loss_gradient(X, y, w, normaliser=config.normaliser),
            t,
            polytope=config.polytope,
            iterations=config.iterations,
            epsilon_step=config.epsilon_step,
            score_sensitivity=config.score_sensitivity,
            noise=source,
        )

    return _iterate(config.polytope.start(torch.float64, data.X.device), config.iterations, hooks, update)


# ============================================================================ Alg 3


@dataclass(frozen=True)
class SparseLinRegConfig:
    iterations: int
    block_size: float
    sparsity: int
    truncation: float
    step: float
    radius: float
    laplace_scale: float
    sensitivity: float
    """λ: the ℓ∞ sensitivity of the vector Peeling selects from and releases (laplace_scale = σ·λ)."""


def linreg_half_step(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, config: SparseLinRegConfig) -> torch.Tensor:
    """w^{t+.5} = w − (η₀/m)Σx̃(⟨x̃,w⟩ − ỹ) on the clipped block, m the public block size."""
    X, y = _clip(X, config.truncation), _clip(y, config.truncation)
    return w - config.step * (X.T @ (X @ w - y)) / config.block_size


def run_ht_sparse_linreg(
    data: RowAccess,
    config: SparseLinRegConfig,
    *,
    generator: SecureRandom,
    hooks: TrainingHooks,
    noise: NoiseSource | None = None,
) -> LoopOutcome:
    """Alg 3: w − (η₀/m)Σx̃(⟨x̃,w⟩ − ỹ) on the block → Peeling → projection onto the ℓ2 ball."""
    source = noise or ExactNoise(generator)

    def update(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, t: int) -> torch.Tensor:
        half = linreg_half_step(X, y, w, config)
        released = peeling(
            half, sparsity=config.sparsity, scale=config.laplace_scale, sensitivity=config.sensitivity, noise=source
        )
        return project_l2_ball(released, config.radius)

    start = torch.zeros(data.dim, dtype=torch.float64, device=data.X.device)
    return _over_blocks(data, start, config.iterations, generator=generator, hooks=hooks, update=update)


# ============================================================================ Alg 5


@dataclass(frozen=True)
class SparseOptConfig:
    iterations: int
    block_size: float
    sparsity: int
    scale: float
    beta: float
    step: float
    loss: str
    laplace_scale: float
    sensitivity: float
    """λ: the ℓ∞ sensitivity of the vector Peeling selects from and releases (laplace_scale = σ·λ)."""
    term_bound: float
    """Bound on |ψ|/k that sensitivity assumes (the catalogue's sup |φ|); terms are clipped to it."""
    l2: float = 0.0
    regulariser_in_estimator: bool = True


def sparse_opt_half_step(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, config: SparseOptConfig) -> torch.Tensor:
    """w^{t+.5} = w − η·g̃ with g̃ the robust mean of the block's per-sample gradients at w^t."""
    inside = config.l2 if config.regulariser_in_estimator else 0.0
    grads = per_sample_gradients(config.loss, w, X, y, l2=inside)
    estimate = (
        robust_mean_sum(grads, kappa=config.scale, beta=config.beta, term_bound=config.term_bound) / config.block_size
    )
    if not config.regulariser_in_estimator:
        estimate = estimate + config.l2 * w  # deterministic given w: adds no sensitivity
    return w - config.step * estimate


def run_ht_sparse_opt(
    data: RowAccess,
    config: SparseOptConfig,
    *,
    generator: SecureRandom,
    hooks: TrainingHooks,
    noise: NoiseSource | None = None,
) -> LoopOutcome:
    """Alg 5: robust mean of the block's per-sample gradients at w^t (the step's own point) → step → Peeling."""
    source = noise or ExactNoise(generator)

    def update(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, t: int) -> torch.Tensor:
        half = sparse_opt_half_step(X, y, w, config)
        return peeling(
            half, sparsity=config.sparsity, scale=config.laplace_scale, sensitivity=config.sensitivity, noise=source
        )

    start = torch.zeros(data.dim, dtype=torch.float64, device=data.X.device)
    return _over_blocks(data, start, config.iterations, generator=generator, hooks=hooks, update=update)
