"""The exact single-job bound of a job whose every mechanism is a Gaussian: it is μ-GDP.

μ² = Σ count/σ² over the Gaussian leaves (a q = 1 subsampled Gaussian is one; a ρ-zCDP leaf
declared a Gaussian release adds 2ρ·count), and the exact μ-GDP profile

    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)

(Balle & Wang 2018; Dong, Roth & Su 2019) is inverted. For a zCDP budget filter whose Gaussians'
noise is chosen from earlier releases, fully adaptive composition for GDP (Smith & Thakurta 2022)
gives the same μ as long as the realised Σμ_i² is at most the event's 2ρ·count, which is what the
event bounds. Not used by the ledger (docs/single-job-epsilon.md).
"""

from __future__ import annotations

import math
from typing import ClassVar

from scipy.special import log_ndtr

from kernel.privacy.accountant import Role, epsilon_query, registered
from kernel.privacy.conversion import validate_delta
from kernel.privacy.epsilon_search import delta_upper_bound, smallest_epsilon
from kernel.privacy.events import GaussianEvent, LeafEvent, PoissonSampledGaussianEvent, ZCDPEvent
from kernel.privacy.leaf_accountant import LeafAccountant
from kernel.privacy.rounding import round_up


def gaussian_dp_log_delta(*, mu: float, epsilon: float) -> float:
    """log δ(ε) of μ-GDP: log[Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)], without under/overflow."""
    a = -epsilon / mu + mu / 2.0
    b = -epsilon / mu - mu / 2.0
    log_first = float(log_ndtr(a))
    ratio = math.exp(min(0.0, epsilon + float(log_ndtr(b)) - log_first))
    if ratio >= 1.0:
        return -math.inf
    return log_first + math.log1p(-ratio)


def gaussian_dp_delta(*, mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2019, Cor 2.13)."""
    return math.exp(gaussian_dp_log_delta(mu=mu, epsilon=epsilon))


def gaussian_dp_epsilon(*, mu: float, delta: float) -> float:
    """The smallest ε with δ_μ(ε) ≤ δ, rounded up (0 for μ = 0)."""
    delta = validate_delta(delta)
    if mu == 0.0:
        return 0.0
    if not (math.isfinite(mu) and mu > 0.0):
        raise ValueError(f"μ must be finite and >= 0, got {mu!r}")
    # δ_μ(ε) ≤ Φ(−ε/μ + μ/2) ≤ δ once ε ≥ μ²/2 + μ·sqrt(2 log(1/δ)): a valid upper end.
    # −log δ, not log(1/δ): 1/δ overflows to inf for a subnormal δ.
    upper = mu * mu / 2.0 + mu * math.sqrt(-2.0 * math.log(delta)) + 1.0
    return smallest_epsilon(lambda eps: gaussian_dp_log_delta(mu=mu, epsilon=eps), delta=delta, upper=upper)


def is_gaussian(leaf: LeafEvent, *, zcdp_is_gaussian: bool) -> bool:
    """Whether the leaf is a Gaussian release (a ρ-zCDP leaf only when the algorithm declares it)."""
    if isinstance(leaf, GaussianEvent):
        return True
    if isinstance(leaf, PoissonSampledGaussianEvent):
        return leaf.sampling_probability == 1.0
    return zcdp_is_gaussian and isinstance(leaf, ZCDPEvent)


def gdp_mu(leaves: tuple[LeafEvent, ...]) -> float:
    """μ = sqrt(Σ μ_i²): count/σ² per Gaussian leaf, 2ρ·count per (Gaussian) zCDP leaf."""
    squares = []
    for leaf in leaves:
        if isinstance(leaf, ZCDPEvent):
            squares.append(2.0 * leaf.rho * leaf.count)
        else:
            sigma = leaf.noise_multiplier  # type: ignore[union-attr]  # a Gaussian leaf (is_gaussian)
            squares.append(leaf.count / (sigma * sigma))
    return math.sqrt(round_up(math.fsum(squares)))


@registered
class GaussianDpAccountant(LeafAccountant):
    """Every mechanism a Gaussian: the exact μ-GDP profile, inverted at δ (and evaluated at ε)."""

    method: ClassVar[str] = "gaussian-dp"
    role: ClassVar[Role] = Role.EXACT
    LABEL: ClassVar[str] = (
        "exact single-job bound: the job is μ-Gaussian-DP (exact privacy profile); not used by the ledger"
    )

    @property
    def mu(self) -> float:
        return gdp_mu(self.leaves)

    def epsilon(self, delta: float) -> float:
        return gaussian_dp_epsilon(mu=self.mu, delta=delta)

    def delta(self, epsilon: float) -> float:
        epsilon = epsilon_query(epsilon)
        mu = self.mu
        return 0.0 if mu == 0.0 else delta_upper_bound(gaussian_dp_log_delta(mu=mu, epsilon=epsilon))

    def _leaf_unsupported(self, leaf: LeafEvent) -> str | None:
        if is_gaussian(leaf, zcdp_is_gaussian=self.zcdp_is_gaussian):
            return None
        return "not a Gaussian mechanism (a ρ-zCDP leaf counts only when the algorithm declares it Gaussian)"
