"""Each leaf as a mechanism with a known privacy-loss distribution that dominates it, for the numeric
accountants (PRV, PLD), which model only Gaussian, subsampled-Gaussian, Laplace and pure-DP losses.

* a ρ-zCDP leaf declared a Gaussian release is the Gaussian with σ = 1/sqrt(2ρ) (the same μ); an
  arbitrary ρ-zCDP mechanism has no known privacy-loss distribution, so it has no rewrite;
* an ε0-bounded-range leaf is ε0-DP, and randomized response dominates every ε0-DP mechanism;
  dominating pairs compose adaptively (Zhu, Dong & Wang 2022).

One rewrite per leaf kind, registered below; a kind without one has no dominating mechanism here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from kernel.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    LeafEvent,
    PoissonSampledGaussianEvent,
    PureDPEvent,
    ZCDPEvent,
)
from kernel.privacy.leaf_accountant import LeafAccountant

_L = TypeVar("_L")
_Rewrite = Callable[[LeafEvent, bool], LeafEvent | None]
_REWRITES: dict[type, _Rewrite] = {}  # filled once at import by @_rewrite_of


def dominating_leaf(leaf: LeafEvent, *, zcdp_is_gaussian: bool) -> LeafEvent | None:
    """The dominating mechanism of ``leaf`` (with its count), or None when there is none."""
    rewrite = _REWRITES.get(type(leaf))
    return None if rewrite is None else rewrite(leaf, zcdp_is_gaussian)


def _rewrite_of(
    leaf_type: type[_L],
) -> Callable[[Callable[[_L, bool], LeafEvent | None]], Callable[[_L, bool], LeafEvent | None]]:
    def register(rewrite: Callable[[_L, bool], LeafEvent | None]) -> Callable[[_L, bool], LeafEvent | None]:
        _add(leaf_type, rewrite)  # type: ignore[arg-type]  # called only with a _L leaf
        return rewrite

    return register


def _add(leaf_type: type, rewrite: _Rewrite) -> None:
    if leaf_type in _REWRITES:
        raise RuntimeError(f"dominating rewrite of {leaf_type.__name__} registered twice")
    _REWRITES[leaf_type] = rewrite


def _itself(leaf: LeafEvent, _zcdp_is_gaussian: bool) -> LeafEvent:
    """A mechanism the numeric accountants model as it is."""
    return leaf


for _kind in (GaussianEvent, PoissonSampledGaussianEvent, LaplaceEvent, PureDPEvent):
    _add(_kind, _itself)


@_rewrite_of(ZCDPEvent)
def _gaussian_zcdp(leaf: ZCDPEvent, zcdp_is_gaussian: bool) -> LeafEvent | None:
    if not zcdp_is_gaussian:
        return None
    return GaussianEvent(noise_multiplier=1.0 / math.sqrt(2.0 * leaf.rho), count=leaf.count)


@_rewrite_of(ExponentialMechanismEvent)
def _bounded_range(leaf: ExponentialMechanismEvent, _zcdp_is_gaussian: bool) -> LeafEvent:
    return PureDPEvent(epsilon=leaf.epsilon, count=leaf.count)


class DominatedLeafAccountant(LeafAccountant):
    """A numeric accountant: it supports the leaves with a dominating mechanism and prices those."""

    def dominating_event(self) -> ComposedEvent:
        """The composed leaves, each as its dominating mechanism."""
        rewritten = []
        for leaf in self.leaves:
            dominating = dominating_leaf(leaf, zcdp_is_gaussian=self.zcdp_is_gaussian)
            assert dominating is not None  # compose accepted only leaves with one
            rewritten.append(dominating)
        return ComposedEvent(events=tuple(rewritten))

    def _leaf_unsupported(self, leaf: LeafEvent) -> str | None:
        if dominating_leaf(leaf, zcdp_is_gaussian=self.zcdp_is_gaussian) is not None:
            return None
        return "no known privacy-loss distribution (a ρ-zCDP leaf has one only when declared a Gaussian release)"
