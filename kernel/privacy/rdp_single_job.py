"""One job's RDP converted at δ itself, for the report: no union bound over the ledger's grid and,
when every mechanism has a closed-form RDP, the best real order α > 1 rather than a grid order
(Canonne, Kamath & Steinke 2020, the conversion of :mod:`kernel.privacy.conversion`).

For a ρ-zCDP leaf that is not declared Gaussian this is the optimal ρ-zCDP → (ε, δ) conversion,
which is what holds for an arbitrary ρ-zCDP mechanism (its privacy profile is not known beyond its
Rényi divergences). A hyperparameter tuning is known only as an RDP curve on the grid, so an event
containing one gets the grid orders only. Each candidate is evaluated with outward rounding at its
own α, so the optimiser's accuracy affects tightness only, never validity. Not used by the ledger.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar, Final, TypeVar

import numpy as np
from scipy.optimize import minimize_scalar

from kernel.privacy.accountant import PrivacyAccountant, Role, epsilon_query, registered
from kernel.privacy.conversion import delta_from_rdp, epsilon_from_rdp, validate_delta
from kernel.privacy.events import (
    ExponentialMechanismEvent,
    GaussianEvent,
    LeafEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    ZCDPEvent,
    contains_tuning,
    iter_leaves,
)
from kernel.privacy.leaf_accountant import LeafCounts
from kernel.privacy.rdp import unsupported_by_rdp
from kernel.privacy.rdp_accountant import RdpAccountant
from kernel.privacy.rounding import round_up, round_up_sum

_MAX_ORDER: Final[float] = 1e7

_L = TypeVar("_L")
_PerUse = Callable[[float], float]
"""One use's RDP at a real order α > 1."""
_Term = tuple[_PerUse, int]

# Filled once at import by @_closed_form: leaf kind -> its per-use RDP at any real order, or None
# for a leaf of that kind without one (a subsampled Gaussian with q < 1).
_CLOSED_FORMS: dict[type, Callable[[LeafEvent], _PerUse | None]] = {}


def _closed_form(
    leaf_type: type[_L],
) -> Callable[[Callable[[_L], _PerUse | None]], Callable[[_L], _PerUse | None]]:
    def register(formula: Callable[[_L], _PerUse | None]) -> Callable[[_L], _PerUse | None]:
        if leaf_type in _CLOSED_FORMS:
            raise RuntimeError(f"closed-form RDP of {leaf_type.__name__} registered twice")
        _CLOSED_FORMS[leaf_type] = formula  # type: ignore[assignment]  # called only with a _L leaf
        return formula

    return register


def _gaussian_at(sigma: float) -> _PerUse:
    return lambda order: order / (2.0 * sigma * sigma)


@_closed_form(GaussianEvent)
def _gaussian(leaf: GaussianEvent) -> _PerUse:
    return _gaussian_at(leaf.noise_multiplier)


@_closed_form(PoissonSampledGaussianEvent)
def _subsampled_gaussian(leaf: PoissonSampledGaussianEvent) -> _PerUse | None:
    return _gaussian_at(leaf.noise_multiplier) if leaf.sampling_probability == 1.0 else None


@_closed_form(ZCDPEvent)
def _zcdp(leaf: ZCDPEvent) -> _PerUse:
    return lambda order: leaf.rho * order


@_closed_form(PureDPEvent)
def _pure_dp(leaf: PureDPEvent) -> _PerUse:
    return lambda order: min(leaf.epsilon, order * leaf.epsilon**2 / 2.0)


@_closed_form(ExponentialMechanismEvent)
def _bounded_range(leaf: ExponentialMechanismEvent) -> _PerUse:
    return lambda order: min(leaf.epsilon, order * leaf.epsilon**2 / 8.0)


def rdp_single_job_epsilon(event: PrivacyEvent, delta: float) -> float:
    """RDP of this job converted at δ (no union bound): :class:`RdpAtDeltaAccountant` of the event."""
    delta = validate_delta(delta)
    return RdpAtDeltaAccountant().compose(event).epsilon(delta)


@registered
class RdpAtDeltaAccountant(PrivacyAccountant):
    """The composed RDP curve and mechanisms, converted at δ over the grid and the real orders."""

    method: ClassVar[str] = "rdp-single-job"
    role: ClassVar[Role] = Role.BOUND
    LABEL: ClassVar[str] = (
        "single-job bound: RDP converted at δ over all orders (no ledger union bound); not used by the ledger"
    )
    ZCDP_LABEL: ClassVar[str] = (
        "single-job bound: optimal ρ-zCDP conversion at δ over all orders; not used by the ledger"
    )

    def __init__(self, *, zcdp_is_gaussian: bool = False) -> None:
        super().__init__(zcdp_is_gaussian=zcdp_is_gaussian)
        self._rdp = RdpAccountant()
        self._counts = LeafCounts()
        self._tuned = False

    @property
    def label(self) -> str:
        leaves = () if self._tuned else self._counts.leaves
        if leaves and all(isinstance(leaf, ZCDPEvent) for leaf in leaves):
            return self.ZCDP_LABEL
        return self.LABEL

    def epsilon(self, delta: float) -> float:
        delta = validate_delta(delta)
        curve = self._rdp.curve
        if self._tuned:
            return max(0.0, epsilon_from_rdp(curve, delta)[0])  # grid orders only
        leaves = self._counts.leaves
        if not leaves:
            return 0.0  # no mechanism ran
        best = epsilon_from_rdp(curve, delta)[0]
        terms = _closed_form_terms(leaves)
        if terms is not None:
            order = _best_real_order(terms, delta)
            best = min(best, _converted(terms, order=order, delta=delta))
        return max(0.0, best)

    def delta(self, epsilon: float) -> float:
        """The best grid order's δ at ``epsilon`` (0 when no mechanism ran)."""
        epsilon = epsilon_query(epsilon)
        if not self._tuned and not self._counts.leaves:
            return 0.0
        return delta_from_rdp(self._rdp.curve, epsilon)

    def _unsupported(self, event: PrivacyEvent) -> str | None:
        return unsupported_by_rdp(event)

    def _compose(self, event: PrivacyEvent, count: int) -> None:
        self._rdp.compose(event, count)
        if contains_tuning(event):
            self._tuned = True
        else:
            self._counts.add(iter_leaves(event), times=count)


def _closed_form_terms(leaves: tuple[LeafEvent, ...]) -> list[_Term] | None:
    """Each leaf's per-use RDP at real orders with its count, or None when one has no closed form."""
    terms: list[_Term] = []
    for leaf in leaves:
        formula = _CLOSED_FORMS.get(type(leaf))
        per_use = None if formula is None else formula(leaf)
        if per_use is None:
            return None
        terms.append((per_use, leaf.count))
    return terms


def _rdp_terms(terms: list[_Term], order: float) -> list[float]:
    """Per-leaf RDP at a real order, each rounded up (the formulas of kernel.privacy.rdp)."""
    return [round_up(round_up(per_use(order)) * count) for per_use, count in terms]


def _converted(terms: list[_Term], *, order: float, delta: float) -> float:
    """ε at one real order: Σ RDP + log1p(−1/α) − (log δ + log α)/(α − 1), rounded outward."""
    t0 = math.log1p(-1.0 / order)
    t1 = -(math.log(delta) + math.log(order)) / (order - 1.0)
    return round_up_sum((*_rdp_terms(terms, order), t0, t1))


def _best_real_order(terms: list[_Term], delta: float) -> float:
    """A near-optimal α: a log-spaced scan of α − 1 over [1e-4, 1e7], refined by bounded Brent."""

    def objective(log_excess: float) -> float:
        order = 1.0 + math.exp(log_excess)
        return math.fsum(
            (*_rdp_terms(terms, order), math.log1p(-1.0 / order), -(math.log(delta) + math.log(order)) / (order - 1.0))
        )

    grid = np.linspace(math.log(1e-4), math.log(_MAX_ORDER), 400)
    values = [objective(x) for x in grid]
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    if hi > lo:
        result = minimize_scalar(objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
        x = float(result.x) if result.fun <= values[i] else float(grid[i])
    else:
        x = float(grid[i])
    return 1.0 + math.exp(x)
