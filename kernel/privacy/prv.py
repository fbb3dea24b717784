"""Tight single-job epsilon from prv-accountant (Gopi, Lee, Wutschitz 2021), for the report only.

PRV composition is not a valid privacy filter over adaptively chosen jobs (docs/privacy-model.md#known-traps), so
this number never touches the ledger. It is the accountant's *upper* bound (third value of
``compute_epsilon``); whenever the computation cannot be trusted the answer is None and the
report shows only the RDP number. Events containing zCDP or exponential-mechanism leaves have no
PRV here and also give None; :class:`kernel.privacy.prv_accountant.PrvAccountant` rewrites such
leaves into dominating mechanisms (:mod:`kernel.privacy.dominating`) before calling this, and the
single-job report (:mod:`kernel.privacy.single_job`) is what the report and the API show. Events containing
hyperparameter tuning give None too: a best-of-K release is not a composition of known PRVs, only
its RDP bound is known.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from typing import Final, TypeVar

import numpy as np
from prv_accountant import (
    GaussianMechanism,
    LaplaceMechanism,
    PoissonSubsampledGaussianMechanism,
    PrivacyRandomVariable,
    PRVAccountant,
    PureDPMechanism,
)

from kernel.privacy.conversion import validate_delta
from kernel.privacy.events import (
    GaussianEvent,
    LaplaceEvent,
    LeafEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    contains_tuning,
    iter_leaves,
)
from kernel.privacy.ranges import DELTA_MIN
from kernel.privacy.rounding import round_up

EPS_ERROR: Final[float] = 0.01
DELTA_ERROR_FRACTION: Final[float] = 1e-3

_L = TypeVar("_L")
_Factory = Callable[[PrivacyEvent], PrivacyRandomVariable]
_FACTORIES: dict[type, _Factory] = {}  # filled once at import by @_prv_for


def _prv_for(
    event_type: type[_L],
) -> Callable[[Callable[[_L], PrivacyRandomVariable]], Callable[[_L], PrivacyRandomVariable]]:
    """Register the PRV (one use, without count) of a leaf kind."""

    def register(factory: Callable[[_L], PrivacyRandomVariable]) -> Callable[[_L], PrivacyRandomVariable]:
        if event_type in _FACTORIES:
            raise RuntimeError(f"PRV for {event_type.__name__} registered twice")
        _FACTORIES[event_type] = factory  # type: ignore[assignment]
        return factory

    return register


class _PureDPWithSoundRdp(PureDPMechanism):  # type: ignore[misc]  # prv-accountant has no type hints
    """prv-accountant 0.2.0's PureDPMechanism.rdp returns (a-1)eps/a, which is BELOW the true RDP
    of randomized response (e.g. eps=1, a=2: 0.5 vs 0.735). PRVAccountant sizes its domain from
    rdp(), so an underestimate can put composed mass outside the domain. Use the valid bound
    min(eps, a eps^2/2) instead; the PRV itself (cdf) is unchanged."""

    def rdp(self, alpha: float) -> float:
        eps: float = self.eps
        return min(eps, alpha * eps * eps / 2.0)


@_prv_for(PoissonSampledGaussianEvent)
def _subsampled_gaussian(event: PoissonSampledGaussianEvent) -> PrivacyRandomVariable:
    if event.sampling_probability == 1.0:
        return GaussianMechanism(noise_multiplier=event.noise_multiplier)
    return PoissonSubsampledGaussianMechanism(
        sampling_probability=event.sampling_probability, noise_multiplier=event.noise_multiplier
    )


@_prv_for(GaussianEvent)
def _gaussian(event: GaussianEvent) -> PrivacyRandomVariable:
    return GaussianMechanism(noise_multiplier=event.noise_multiplier)


@_prv_for(LaplaceEvent)
def _laplace(event: LaplaceEvent) -> PrivacyRandomVariable:
    # LaplaceMechanism(mu) is parameterised by the privacy loss bound mu = sensitivity / b = 1/b
    # (its cdf is supported on [-mu, mu] and its rdp is Mironov's formula at eps = mu).
    return LaplaceMechanism(mu=1.0 / event.noise_multiplier)


@_prv_for(PureDPEvent)
def _pure_dp(event: PureDPEvent) -> PrivacyRandomVariable:
    return _PureDPWithSoundRdp(eps=event.epsilon)


@lru_cache(maxsize=512)
def prv_epsilon(event: PrivacyEvent, delta: float) -> float | None:
    """prv-accountant's upper bound on epsilon of this one event at ``delta``, or None.

    None below DELTA_MIN (only rows stored before it was enforced): its delta_error would be
    subnormal or 0, where the accountant's numerics are not trustworthy."""
    delta = validate_delta(delta)
    if delta < DELTA_MIN or contains_tuning(event):
        return None
    counts: dict[LeafEvent, int] = {}
    for leaf in iter_leaves(event):
        if type(leaf) not in _FACTORIES:
            return None
        count = leaf.count
        if count > 0:
            one_use = _one_use(leaf)
            counts[one_use] = counts.get(one_use, 0) + count
    if not counts:
        return 0.0
    try:
        prvs = [_FACTORIES[type(leaf)](leaf) for leaf in counts]
        compositions = list(counts.values())
        with np.errstate(all="ignore"):
            accountant = PRVAccountant(
                prvs=prvs,
                max_self_compositions=compositions,
                eps_error=EPS_ERROR,
                delta_error=delta * DELTA_ERROR_FRACTION,
            )
            _, _, upper = accountant.compute_epsilon(delta=delta, num_self_compositions=compositions)
    except Exception:  # noqa: BLE001 - any failure of the numerics means "no trustworthy number"
        return None
    upper = float(upper)
    if not math.isfinite(upper) or upper < 0.0:
        return None
    return round_up(upper)


def _one_use(leaf: LeafEvent) -> LeafEvent:
    """The leaf with count 1, used as a key so identical mechanisms are composed by FFT at once."""
    return replace(leaf, count=1)
