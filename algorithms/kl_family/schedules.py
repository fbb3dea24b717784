"""The KL-condition family's public schedules: KL-Spider's rounds (Alg 1), adaptive noisy GD's
constants (Alg 3) and the proximal-point iteration counts (Alg 2 / Alg 4). Every value is a function
of public inputs (n, d, ρ and the declared constants); the noise levels follow the allocations
derived in algorithms/kl_family/accounting.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from algorithms.kl_family.accounting import NEIGHBOUR_FACTOR, Neighbour

__all__ = [
    "AdaptiveConstants",
    "SpiderRound",
    "SpiderSchedule",
    "adaptive_constants",
    "inner_solver_steps",
    "outer_iterations",
    "paper_inner_iterations",
    "spider_schedule",
]


# ----------------------------------------------------------------------------- Alg 1 schedule


@dataclass(frozen=True)
class SpiderRound:
    """Round k's public parameters (noise std's are of the released AVERAGE, before safety)."""

    phi: float
    steps: int
    """T_k: the most normalised steps of the round."""
    step_length: float
    """r_k = Φ̂_k^{1/κ}/(4γL1)."""
    difference_clip: float
    """C_k = L1·r_k = Φ̂_k^{1/κ}/(4γ): per-example bound of a gradient difference."""
    threshold: float
    """τ_k = 7Φ̂_k^{1/κ}/(8γ): the round stops once the noisy gradient is shorter."""
    difference_noise: float
    """s_k (0 when M_k = 0)."""

    @property
    def differences(self) -> int:
        return self.steps - 1


@dataclass(frozen=True)
class SpiderSchedule:
    """The public schedule; rounds are computed on demand (K can be large, and rounds after the
    floor are all alike), so building a schedule costs O(1) whatever K is."""

    c: float
    K: int
    t_max: int
    beta_prime: float
    theta: float
    c_floor: float
    phi_floor: float
    vacuous: bool
    start_noise: float
    """ŝ: the round-start noise std on the average."""
    n: float
    rho: float
    L1: float
    gamma: float
    kappa: float
    F0: float
    factor: float

    def round(self, k: int) -> SpiderRound:
        """Round k (1-based): Φ̂_k = max{F0·c^{−k}, Φ_floor}, the closed form of the paper's recursion."""
        if not 1 <= k <= self.K:
            raise ValueError(f"round {k} outside 1..{self.K}")
        phi = max(self.F0 * self.c ** (-k), self.phi_floor)
        e = (2.0 - self.kappa) / self.kappa
        steps = max(1, math.ceil((self.F0 / phi) ** e * (1.0 - 1e-12)))
        root = phi ** (1.0 / self.kappa)
        clip = root / (4.0 * self.gamma)
        m = steps - 1
        noise = 0.0
        if m and self.theta < 1.0:
            noise = (self.factor * clip / self.n) * math.sqrt(self.K * m / (2.0 * (1.0 - self.theta) * self.rho))
        return SpiderRound(
            phi=phi,
            steps=steps,
            step_length=root / (4.0 * self.gamma * self.L1),
            difference_clip=clip,
            threshold=7.0 * root / (8.0 * self.gamma),
            difference_noise=noise,
        )

    @property
    def rounds(self) -> tuple[SpiderRound, ...]:
        """All K rounds (materialised: for inspection and tests)."""
        return tuple(self.round(k) for k in range(1, self.K + 1))

    @property
    def has_differences(self) -> bool:
        """T_k grows as Φ̂_k falls, so some round has a difference iff the last one does."""
        return self.round(self.K).differences > 0

    @property
    def start_share(self) -> Fraction:
        """Share of ρ allocated to one round start: θ/K (exact)."""
        return Fraction(self.theta) / self.K

    def difference_share(self, k: int) -> Fraction:
        """Share of ρ of one difference in round k (1-based): (1−θ)/(K·M_k) (exact)."""
        return (1 - Fraction(self.theta)) / (self.K * self.round(k).differences)

    @property
    def total_differences(self) -> int:
        return sum(r.differences for r in self.rounds)

    @property
    def worst_case_share(self) -> Fraction:
        share = self.start_share * self.K
        for k, r in enumerate(self.rounds, start=1):
            if r.differences:
                share += self.difference_share(k) * r.differences
        return share


def _spider_schedule_at(
    *,
    n: float,
    d: int,
    rho: float,
    L0: float,
    L1: float,
    gamma: float,
    kappa: float,
    F0: float,
    beta: float,
    theta: float,
    neighbour: Neighbour,
) -> SpiderSchedule | None:
    e = (2.0 - kappa) / kappa
    sqrt_rho = math.sqrt(rho)
    bracket = math.log(F0) + kappa * math.log(n * sqrt_rho / (gamma * L0 * math.sqrt(d)))
    if bracket <= 0:
        return None
    c = 1.0 + F0**e / (64.0 * gamma**2 * L1)
    K = max(1, math.ceil((1.0 + 64.0 * (1.0 / F0) ** e * gamma**2 * L1) * bracket))
    t_max = math.ceil((n * sqrt_rho * F0 ** (1.0 / kappa) / (gamma * L0 * math.sqrt(K * d))) ** (2.0 - kappa))
    beta_prime = beta / (K * (1 + t_max))
    factor = NEIGHBOUR_FACTOR[neighbour]
    second = 1.0 / (2.0 * math.sqrt(2.0 * (1.0 - theta))) if theta < 1.0 else 0.0
    c_floor = 8.0 * factor * (math.sqrt(2.0 / theta) + second)
    phi_floor = min(
        (c_floor * gamma * L0 * math.sqrt(K * d * math.log(1.0 / beta_prime)) / (n * sqrt_rho)) ** kappa,
        F0,
    )
    return SpiderSchedule(
        c=c,
        K=K,
        t_max=t_max,
        beta_prime=beta_prime,
        theta=theta,
        c_floor=c_floor,
        phi_floor=phi_floor,
        vacuous=phi_floor >= F0,
        start_noise=(factor * L0 / n) * math.sqrt(K / (2.0 * theta * rho)),
        n=n,
        rho=rho,
        L1=L1,
        gamma=gamma,
        kappa=kappa,
        F0=F0,
        factor=factor,
    )


def spider_schedule(
    *,
    n: float,
    d: int,
    rho: float,
    L0: float,
    L1: float,
    gamma: float,
    kappa: float,
    F0: float,
    beta: float,
    theta: float = 0.5,
    neighbour: Neighbour = "add-remove",
) -> SpiderSchedule | None:
    """The whole public schedule of KL-Spider (docs/algorithms/kl-family.md#sensitivities).

    None when the paper's bracket log F0 + κ log(n√ρ/(γL0√d)) is ≤ 0: w0 already meets the
    target and the run spends nothing. θ becomes 1 (all of ρ on round starts) when no round has
    a difference — the floor is then the θ = 1 one if that still leaves every T_k = 1 (κ = 2),
    else the user's θ's larger, still valid floor.
    ``neighbour='replace-one'`` reproduces the paper's replace-one numbers, hand-checked in
    tests/unit/test_kl_accounting.py.
    """

    def at(share: float) -> SpiderSchedule | None:
        return _spider_schedule_at(
            n=n,
            d=d,
            rho=rho,
            L0=L0,
            L1=L1,
            gamma=gamma,
            kappa=kappa,
            F0=F0,
            beta=beta,
            theta=share,
            neighbour=neighbour,
        )

    whole = at(1.0)
    if whole is None or not whole.has_differences:
        return whole  # e.g. κ = 2: every T_k = 1, the whole budget goes to round starts
    schedule = at(theta)
    if schedule is not None and not schedule.has_differences:
        # θ's larger floor leaves no difference: keep that (valid, larger) floor and its rounds,
        # but give the unused difference budget to the round starts.
        start_noise = NEIGHBOUR_FACTOR[neighbour] * (L0 / n) * math.sqrt(schedule.K / (2.0 * rho))
        return replace(schedule, theta=1.0, start_noise=start_noise)
    return schedule


# ----------------------------------------------------------------------------- Alg 3 constants


@dataclass(frozen=True)
class AdaptiveConstants:
    """Public constants of adaptive noisy GD for one job (std's of the released average/norm)."""

    rho: float
    sensitivity: float
    """Δ = L0/n (add/remove)."""
    log_term: float
    """A = log(n√ρ/β)."""
    dimension: int
    norm_noise: float
    """ŝ = L0/(√n ρ^{1/4})."""
    norm_cost: float
    """c_N = Δ²/(2ŝ²)."""
    floor_noise: float
    """s_min = Δ/√(2(ρ/2 − c_N))."""

    def gradient_noise(self, noisy_norm: float) -> float:
        """s_t = max(N_t⁺/√(dA), s_min): a function of the released N_t only."""
        return max(max(noisy_norm, 0.0) / math.sqrt(self.dimension * self.log_term), self.floor_noise)

    def gradient_cost(self, noise: float) -> float:
        """Exact zCDP cost Δ²/(2s²) of a gradient release with std s."""
        return self.sensitivity**2 / (2.0 * noise * noise)

    @property
    def max_iterations(self) -> int:
        """An iteration costs ≥ c_N and iterations start only while spent ≤ ρ/2."""
        return 1 + math.floor((self.rho / 2.0) / self.norm_cost)


def adaptive_constants(
    *, n: float, d: int, rho: float, L0: float, beta: float, neighbour: Neighbour = "add-remove"
) -> AdaptiveConstants | None:
    """None when the run cannot start (n√ρ/β ≤ 1 or ρ/2 ≤ c_N): it then returns w0 at no cost."""
    factor = NEIGHBOUR_FACTOR[neighbour]
    delta = factor * L0 / n
    log_term_arg = n * math.sqrt(rho) / beta
    if log_term_arg <= 1.0:
        return None
    norm_noise = L0 / (math.sqrt(n) * rho**0.25)
    norm_cost = delta**2 / (2.0 * norm_noise**2)
    if rho / 2.0 <= norm_cost:
        return None
    return AdaptiveConstants(
        rho=rho,
        sensitivity=delta,
        log_term=math.log(log_term_arg),
        dimension=d,
        norm_noise=norm_noise,
        norm_cost=norm_cost,
        floor_noise=delta / math.sqrt(2.0 * (rho / 2.0 - norm_cost)),
    )


# ----------------------------------------------------------------------------- Alg 2 / Alg 4


def paper_inner_iterations(*, n: float, rho_in: float, beta_in: float, d: int) -> int:
    """Thm 9's T_in = ⌈n²ρ_in log²(2/β_in)/d⌉ (iterates; T_in − 1 noisy steps)."""
    return math.ceil(n * n * rho_in * math.log(2.0 / beta_in) ** 2 / d)


def outer_iterations(
    *, n: float, d: int, rho: float, L0: float, L1_tilde: float, gamma: float, kappa: float, F0: float
) -> int:
    """Alg 2's T_out = ⌈(1 + 32F0^{(κ−2)/κ}γ²L̃1)·[log F0 + κ log(n√ρ/(γL0√d))]⌉, 0 if the bracket ≤ 0."""
    bracket = math.log(F0) + kappa * math.log(n * math.sqrt(rho) / (gamma * L0 * math.sqrt(d)))
    if bracket <= 0:
        return 0
    return math.ceil((1.0 + 32.0 * float(F0 ** ((kappa - 2.0) / kappa)) * gamma**2 * L1_tilde) * bracket)


def inner_solver_steps(*, n: float, d: int, rho_in: float, beta_in: float, cap: int) -> int:
    """S_in = min(T_in − 1, cap) ≥ 1 noisy steps per prox subproblem (the cap voids Thm 9)."""
    return max(1, min(paper_inner_iterations(n=n, rho_in=rho_in, beta_in=beta_in, d=d) - 1, cap))
