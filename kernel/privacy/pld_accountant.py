"""dp-accounting's pessimistic privacy-loss distributions (Meiser & Mohammadi 2018; Koskela, Jälkö &
Honkela 2020; Doroshenko et al. 2022) behind the accountant contract: the single-job report's
fallback when prv-accountant fails (e.g. q = 0.1, σ = 0.6, T = 50). Add/remove neighbours: both
directions of every PLD are kept. Never the ledger's (docs/single-job-epsilon.md).

One PLD model per leaf kind (the mechanism's PLD and the spread of its losses, which sizes the
discretisation), registered below; the leaves a kind has no model for are rewritten into
dominating ones first (:mod:`kernel.privacy.dominating`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, Final, TypeVar

from kernel.privacy.accountant import Role, epsilon_query, registered
from kernel.privacy.conversion import validate_delta
from kernel.privacy.dominating import DominatedLeafAccountant
from kernel.privacy.errors import PrivacyEventError, UnsupportedEvent
from kernel.privacy.events import (
    GaussianEvent,
    LaplaceEvent,
    LeafEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    iter_leaves,
)
from kernel.privacy.leaf_accountant import aggregate_leaves
from kernel.privacy.ranges import DELTA_MIN
from kernel.privacy.rounding import round_up

PLD_MAX_BUCKETS: Final[float] = 3e5
"""The discretisation: interval h = max(1e-4, (estimated loss range)/PLD_MAX_BUCKETS), so the
whole computation stays under ~1 s (measured ≤ 0.8 s, ≤ 250 MB) for counts up to 10^5.
A coarser h only makes the pessimistic PLD looser (every loss is rounded up), never invalid."""

_L = TypeVar("_L")


@dataclass(frozen=True)
class _PldModel:
    """What the PLD of one leaf kind needs: its (self-composed) PLD at an interval, its loss spread."""

    pld: Callable[[Any, float], Any]
    spread: Callable[[Any], float]


_MODELS: dict[type, _PldModel] = {}  # filled once at import by _model_for


def _model_for(leaf_type: type[_L], *, pld: Callable[[_L, float], Any], spread: Callable[[_L], float]) -> None:
    if leaf_type in _MODELS:
        raise RuntimeError(f"PLD model of {leaf_type.__name__} registered twice")
    _MODELS[leaf_type] = _PldModel(pld=pld, spread=spread)


def _library() -> tuple[ModuleType, ModuleType]:
    """dp-accounting's PLD modules, imported on first use: 0.7 s to import, and the request path
    (closed forms only) never needs them; the accountant fork server preloads them."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_module

    return common, pld_module


def pld_epsilon(event: PrivacyEvent, delta: float) -> float:
    """The pessimistic PLD ε of an event of Gaussian, subsampled-Gaussian, Laplace and pure-DP leaves."""
    delta = validate_delta(delta)
    if delta < DELTA_MIN:
        raise PrivacyEventError(f"no PLD bound below delta = {DELTA_MIN:g}")  # skipped, like a failure
    total = _composed_pld(event)
    return 0.0 if total is None else round_up(float(total.get_epsilon_for_delta(delta)))


def pld_delta(event: PrivacyEvent, epsilon: float) -> float:
    """The pessimistic PLD δ at ``epsilon`` (an upper bound: every loss is rounded up), capped at 1."""
    epsilon = epsilon_query(epsilon)
    total = _composed_pld(event)
    return 0.0 if total is None else min(1.0, round_up(float(total.get_delta_for_epsilon(epsilon))))


def _composed_pld(event: PrivacyEvent) -> Any:
    """The composed pessimistic PLD of the event's leaves, or None when no mechanism ran."""
    leaves = aggregate_leaves(iter_leaves(event))
    if not leaves:
        return None
    models = [_model(leaf) for leaf in leaves]
    interval = _pld_interval(leaves, models)
    total = None
    for leaf, model in zip(leaves, models, strict=True):
        one = model.pld(leaf, interval)
        total = one if total is None else total.compose(one)
    return total


def _model(leaf: LeafEvent) -> _PldModel:
    model = _MODELS.get(type(leaf))
    if model is None:
        raise UnsupportedEvent(accountant=PldAccountant.method, event=leaf, reason="no PLD model for this kind")
    return model


def _pld_interval(leaves: tuple[LeafEvent, ...], models: list[_PldModel]) -> float:
    """Discretisation interval: 1e-4, coarsened so the composed loss range (bounded by the leaves'
    RDP-free worst cases, ~count·per-use range) spans at most PLD_MAX_BUCKETS buckets."""
    spread = 0.0
    for leaf, model in zip(leaves, models, strict=True):
        spread += model.spread(leaf)
    return max(1e-4, spread / PLD_MAX_BUCKETS)


def _gaussian_pld(leaf: GaussianEvent, interval: float) -> Any:
    return _library()[1].from_gaussian_mechanism(
        leaf.noise_multiplier / math.sqrt(leaf.count),
        pessimistic_estimate=True,
        value_discretization_interval=interval,
    )


def _gaussian_spread(leaf: GaussianEvent) -> float:
    mu = math.sqrt(leaf.count) / leaf.noise_multiplier
    return mu * mu + 20.0 * mu


def _subsampled_gaussian_pld(leaf: PoissonSampledGaussianEvent, interval: float) -> Any:
    return (
        _library()[1]
        .from_gaussian_mechanism(
            leaf.noise_multiplier,
            sampling_prob=leaf.sampling_probability,
            pessimistic_estimate=True,
            value_discretization_interval=interval,
        )
        .self_compose(leaf.count)
    )


def _subsampled_gaussian_spread(leaf: PoissonSampledGaussianEvent) -> float:
    count, q, s = leaf.count, leaf.sampling_probability, leaf.noise_multiplier
    per_use = math.log1p(q * math.expm1(min(1.0 / (s * s), 50.0)))  # mean-scale of one use
    return count * per_use + 20.0 * math.sqrt(count) * per_use + 20.0 / s


def _laplace_pld(leaf: LaplaceEvent, interval: float) -> Any:
    return (
        _library()[1]
        .from_laplace_mechanism(
            leaf.noise_multiplier, pessimistic_estimate=True, value_discretization_interval=interval
        )
        .self_compose(leaf.count)
    )


def _laplace_spread(leaf: LaplaceEvent) -> float:
    return 2.0 * min(leaf.count, 20.0 * math.sqrt(leaf.count)) / leaf.noise_multiplier


def _pure_dp_pld(leaf: PureDPEvent, interval: float) -> Any:
    common, pld_module = _library()
    return pld_module.from_privacy_parameters(
        common.DifferentialPrivacyParameters(leaf.epsilon, 0.0),
        value_discretization_interval=interval,
    ).self_compose(leaf.count)


def _pure_dp_spread(leaf: PureDPEvent) -> float:
    return 2.0 * min(leaf.count, 20.0 * math.sqrt(leaf.count)) * leaf.epsilon


_model_for(GaussianEvent, pld=_gaussian_pld, spread=_gaussian_spread)
_model_for(PoissonSampledGaussianEvent, pld=_subsampled_gaussian_pld, spread=_subsampled_gaussian_spread)
_model_for(LaplaceEvent, pld=_laplace_pld, spread=_laplace_spread)
_model_for(PureDPEvent, pld=_pure_dp_pld, spread=_pure_dp_spread)


@registered
class PldAccountant(DominatedLeafAccountant):
    """The pessimistic PLD of the composed (dominating) mechanisms: ε at δ and δ at ε."""

    method: ClassVar[str] = "pld"
    role: ClassVar[Role] = Role.NUMERIC
    LABEL: ClassVar[str] = "tight single-job upper bound (dp-accounting pessimistic PLD); not used by the ledger"

    def epsilon(self, delta: float) -> float:
        return pld_epsilon(self.dominating_event(), delta)

    def delta(self, epsilon: float) -> float:
        return pld_delta(self.dominating_event(), epsilon)
