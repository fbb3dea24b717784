"""RDP curves of events on the fixed order grid: the ledger's currency (docs/privacy-model.md#ledger).

One function per leaf kind gives the RDP of a *single use* at one order; it is registered with
:func:`_per_use` and the wrapper takes care of validation, outward rounding and ``count``-fold
composition, so each formula stays a few lines. Composition of a tree is the order-wise sum.

Sources of the per-use formulas (a = order > 1):
* Poisson-subsampled Gaussian: prv-accountant's ``PoissonSubsampledGaussianMechanism.rdp``
  (Mironov, Talwar, Zhang 2019; the TF-Privacy computation, integer and fractional orders) plus
  ``SUBSAMPLED_GAUSSIAN_ABS_MARGIN``. q = 1 is the plain Gaussian.
* Gaussian: a / (2 sigma^2).
* Laplace, b = noise_multiplier, eps = 1/b (Mironov 2017, Prop. 6):
  (1/(a-1)) log( a/(2a-1) e^{(a-1) eps} + (a-1)/(2a-1) e^{-a eps} ), capped at eps.
* rho-zCDP: rho a.  Pure eps-DP: min(eps, a eps^2/2).  Bounded-range eps: min(eps, a eps^2/8).

Hyperparameter tuning is not a composition: one trial is bounded by the order-wise maximum of its
candidates' curves, and :func:`kernel.privacy.tuning.tuned_curve` turns that into the tuned cost.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Final, TypeVar

import numpy as np
from prv_accountant import PoissonSubsampledGaussianMechanism

from kernel.privacy.curves import add_curves, max_curves, zero_curve
from kernel.privacy.errors import PrivacyEventError, UnsupportedEvent
from kernel.privacy.events import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    HyperparameterTuningEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    ZCDPEvent,
)
from kernel.privacy.orders import ORDERS, Curve
from kernel.privacy.rounding import round_up
from kernel.privacy.tuning import tuned_curve

# prv-accountant's subsampled-Gaussian RDP is a double-precision log-sum-exp that loses up to
# ~6e-13 in absolute terms per use (measured against 40-digit mpmath over q in [1e-7, 0.9999],
# sigma in [0.1, 3000] and all of ORDERS; for q ~ 1e-8 it even returns tiny negative numbers).
# Relative rounding alone cannot cover an absolute error, so every per-use value is raised by
# this margin, ~15x the worst error seen; tests/unit/privacy re-check it against mpmath.
SUBSAMPLED_GAUSSIAN_ABS_MARGIN: Final[float] = 1e-11

PRV_SIGMA_RANGE: Final[tuple[float, float]] = (1e-3, 1e6)
"""σ range in which prv-accountant's series is called. Below ~1e-155 its fractional-order loop
overflows and never ends (issue "one request must never take the service down"); outside this
range the Gaussian bound a/(2σ²) is used instead (valid: subsampling never increases RDP)."""

_SLOW_SERIES_SIGMA: Final[float] = 1e3
"""For σ above this and q ≈ 1/2 (σ²·|log(1/q − 1)| < 1) the fractional-order series needs up to
~10^6 terms (≈ 0.25 s per order at σ = 1e6); RDP is non-decreasing in the order, so ⌈a⌉ is used there."""

_SMALLEST_POSITIVE: Final[float] = math.ulp(0.0)

_L = TypeVar("_L")
_CurveFunction = Callable[[PrivacyEvent], Curve]

# Filled once at import by the decorators below; never mutated afterwards.
_CURVES: dict[type, _CurveFunction] = {}


def rdp_curve(event: PrivacyEvent) -> Curve:
    """RDP epsilon of ``event`` at every order of ORDERS, rounded up; raises on invalid values."""
    curve_function = _CURVES.get(type(event))
    if curve_function is None:
        raise UnsupportedEvent(accountant="rdp", event=event, reason="no RDP curve for this kind")
    return curve_function(event)


def unsupported_by_rdp(event: PrivacyEvent) -> str | None:
    """Why :func:`rdp_curve` has no curve for some node of the event's tree, or None."""
    if type(event) not in _CURVES:
        return f"no RDP curve for {type(event).__name__}"
    children: tuple[PrivacyEvent, ...] = ()
    if isinstance(event, ComposedEvent):
        children = event.events
    elif isinstance(event, HyperparameterTuningEvent):
        children = event.candidates
    for child in children:
        reason = unsupported_by_rdp(child)
        if reason is not None:
            return reason
    return None


def _curve_for(event_type: type) -> Callable[[_CurveFunction], _CurveFunction]:
    """Register the whole-curve function of an event type."""

    def register(function: _CurveFunction) -> _CurveFunction:
        if event_type in _CURVES:
            raise RuntimeError(f"RDP curve for {event_type.__name__} registered twice")
        _CURVES[event_type] = function
        return function

    return register


def _per_use(event_type: type[_L]) -> Callable[[Callable[[_L, float], float]], Callable[[_L, float], float]]:
    """Register a per-use RDP formula; the wrapper checks it, rounds it up and multiplies by count."""

    def register(per_use: Callable[[_L, float], float]) -> Callable[[_L, float], float]:
        def curve(event: PrivacyEvent) -> Curve:
            count: int = getattr(event, "count")  # noqa: B009 - a leaf, but any event to mypy
            if count == 0:
                return zero_curve()
            return tuple(
                _checked_total(_guarded(per_use, event, order), count=count, event=event)  # type: ignore[arg-type]
                for order in ORDERS
            )

        _curve_for(event_type)(curve)
        return per_use

    return register


def _guarded(per_use: Callable[[_L, float], float], event: _L, order: float) -> float:
    """A formula's arithmetic failure (overflow, division by an underflowed σ²) is a refusal."""
    try:
        return per_use(event, order)
    except (ArithmeticError, ValueError) as exc:
        if isinstance(exc, PrivacyEventError):
            raise
        raise PrivacyEventError(f"RDP of {event!r} at order {order} failed: {exc}") from exc


def _checked_total(value: float, *, count: int, event: object) -> float:
    """count * value, rounded up; a NaN/inf/negative value means the formula failed: refuse it."""
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise PrivacyEventError(f"RDP of {event!r} is not a finite non-negative number ({value!r})")
    # A mechanism with positive parameters has positive RDP; an underflow to 0 must not make it free.
    per_use = round_up(value) if value > 0.0 else _SMALLEST_POSITIVE
    total = round_up(per_use * count)
    if not math.isfinite(total):
        raise PrivacyEventError(f"RDP of {event!r} overflows")
    return total


def _gaussian(noise_multiplier: float, order: float) -> float:
    """a/(2σ²), computed as (a/2)·(1/σ)² so a tiny σ overflows to inf (refused) instead of 0/0."""
    inverse = 1.0 / noise_multiplier
    return (order / 2.0) * inverse * inverse


@_per_use(PoissonSampledGaussianEvent)
def _subsampled_gaussian_rdp(event: PoissonSampledGaussianEvent, order: float) -> float:
    q, sigma = event.sampling_probability, event.noise_multiplier
    if q == 1.0 or not PRV_SIGMA_RANGE[0] <= sigma <= PRV_SIGMA_RANGE[1]:
        return _gaussian(sigma, order)
    if not float(order).is_integer() and _slow_fractional_series(q, sigma):
        order = float(math.ceil(order))
    try:
        return _subsampled_gaussian_rdp_at(q, sigma, float(order))
    except PrivacyEventError as exc:
        raise PrivacyEventError(f"RDP of {event!r} at order {order}: {exc}") from exc


@functools.lru_cache(maxsize=1 << 16)
def _subsampled_gaussian_rdp_at(q: float, sigma: float, order: float) -> float:
    """One use's RDP at one order, memoised: a pure function of three floats, and the slow part of
    pricing (up to ~30 ms at a fractional order), so an estimate followed by the submission of the
    same spec, or a calibration revisiting a σ, costs it once. 65,536 entries ≈ 10 MB at most."""
    mechanism = PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)
    try:
        with np.errstate(over="ignore", under="ignore"):
            value = float(mechanism.rdp(order))
    except (ValueError, OverflowError, ZeroDivisionError) as exc:
        raise PrivacyEventError(f"failed: {exc}") from exc
    if math.isnan(value) or value < -SUBSAMPLED_GAUSSIAN_ABS_MARGIN:
        raise PrivacyEventError(f"invalid ({value!r})")
    return max(value, 0.0) + SUBSAMPLED_GAUSSIAN_ABS_MARGIN


def _slow_fractional_series(q: float, sigma: float) -> bool:
    """True where prv-accountant's fractional-order series converges slowly (q near 1/2, large σ)."""
    return sigma > _SLOW_SERIES_SIGMA and sigma * sigma * abs(math.log1p(-q) - math.log(q)) < 1.0


@_per_use(GaussianEvent)
def _gaussian_rdp(event: GaussianEvent, order: float) -> float:
    return _gaussian(event.noise_multiplier, order)


@_per_use(LaplaceEvent)
def _laplace_rdp(event: LaplaceEvent, order: float) -> float:
    epsilon = 1.0 / event.noise_multiplier
    return min(epsilon, _laplace_log_moment(epsilon, order) / (order - 1.0))


def _laplace_log_moment(epsilon: float, order: float) -> float:
    """log( a/(2a-1) e^{(a-1)eps} + (a-1)/(2a-1) e^{-a eps} ) without overflow or cancellation.

    The argument is 1 + O(eps^2). For a*eps >= 1/2 the result is >= ~0.02 and a log-sum-exp is
    accurate; below that the two exponentials cancel to first order, so the excess over 1 is
    summed as its Taylor series f = a(a-1)eps/(2a-1) * sum_{k>=2} [y^(k-1) + (-1)^k x^(k-1)] / k!
    with x = a eps, y = (a-1) eps (terms shrink like 2^-k/k!).
    """
    a = order
    x = a * epsilon
    if x >= 0.5:
        return float(
            np.logaddexp(math.log(a / (2.0 * a - 1.0)) + (a - 1.0) * epsilon, math.log((a - 1.0) / (2.0 * a - 1.0)) - x)
        )
    y = (a - 1.0) * epsilon
    terms = []
    factorial = 1.0
    for k in range(2, 40):
        factorial *= k
        sign = 1.0 if k % 2 == 0 else -1.0
        terms.append((y ** (k - 1) + sign * x ** (k - 1)) / factorial)
    excess = a * (a - 1.0) * epsilon / (2.0 * a - 1.0) * math.fsum(terms)
    return math.log1p(excess)


@_per_use(ZCDPEvent)
def _zcdp_rdp(event: ZCDPEvent, order: float) -> float:
    return event.rho * order


@_per_use(PureDPEvent)
def _pure_dp_rdp(event: PureDPEvent, order: float) -> float:
    # Bun-Steinke 2016: eps-DP implies (eps^2/2)-zCDP; and D_a <= D_inf = eps.
    eps = event.epsilon
    return min(eps, order * eps * eps / 2.0)


@_per_use(ExponentialMechanismEvent)
def _exponential_mechanism_rdp(event: ExponentialMechanismEvent, order: float) -> float:
    # Cesar-Rogers 2021: eps-bounded range implies (eps^2/8)-zCDP.
    eps = event.epsilon
    return min(eps, order * eps * eps / 8.0)


@_curve_for(ComposedEvent)
def _composed_curve(event: PrivacyEvent) -> Curve:
    if not isinstance(event, ComposedEvent):
        raise PrivacyEventError(f"expected a ComposedEvent, got {event!r}")
    total = zero_curve()
    for child in event.events:
        total = add_curves(total, rdp_curve(child))
    return total


@_curve_for(HyperparameterTuningEvent)
def _tuning_curve(event: PrivacyEvent) -> Curve:
    if not isinstance(event, HyperparameterTuningEvent):
        raise PrivacyEventError(f"expected a HyperparameterTuningEvent, got {event!r}")
    trial = max_curves(rdp_curve(candidate) for candidate in event.candidates)
    return tuned_curve(event.distribution, trial)
