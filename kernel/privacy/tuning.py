"""Private hyperparameter tuning (Papernot & Steinke 2022): the trial-count distributions and the
RDP of "run K trials, release only the best" (docs/privacy-model.md#tuning).

K is drawn independently of the data and never released. Each trial runs a candidate chosen at
random independently of the data, so one trial is (a, c(a))-RDP with c the order-wise maximum of
the candidates' curves (:mod:`kernel.privacy.rdp` forms c; Rényi divergence is jointly quasi-convex).
With c on the grid ORDERS the tuned mechanism is (a, c'(a))-RDP where, for

* K ~ D_{eta,gamma}, the truncated negative binomial (their Theorem 2, any a_hat >= 1; the grid's):
  c'(a) = c(a) + min_{a_hat} [(1+eta)(1 - 1/a_hat) c(a_hat) + (1+eta) log(1/gamma)/a_hat] + log E[K]/(a-1);
* K ~ Poisson(mu) (their Theorem 6): c'(a) = c(a) + mu delta_hat + log(mu)/(a-1), where one trial is
  (eps_hat, delta_hat)-DP with e^eps_hat <= a/(a-1); delta_hat is the CKS conversion of
  :mod:`kernel.privacy.conversion` solved for delta at eps_hat = log(a/(a-1)), minimised over the grid.
  Only mu >= 1: below it the bound is false (a data-independent trial would get a negative cost,
  and tests/unit/privacy/test_privacy_tuning.py finds exact divergences above it).

Each distribution kind registers one :class:`_Model` (mean, pmf, sampler, curve), so adding a kind
is one block, not an if/elif in every function. Costs are rounded up (kernel.privacy.rounding).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from kernel.privacy.conversion import delta_from_rdp
from kernel.privacy.curves import validate_curve
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.events import (
    MAX_TRIALS_LIMIT,
    BoundedPoissonTrials,
    BoundedTrialDistribution,
    BoundedTruncatedNegativeBinomial,
    PoissonTrials,
    TrialDistribution,
    TruncatedNegativeBinomial,
)
from kernel.privacy.orders import ORDERS, Curve
from kernel.privacy.rounding import RELATIVE_SLACK, round_up, round_up_sum

POISSON_CHUNK: Final[float] = 32.0
"""Poisson draws are sums of Poisson(<= 32) draws (Knuth's product method), whose threshold
e^-32 stays far from underflow; a sum of independent Poissons is exactly Poisson."""

_MIN_LOG_GAMMA: Final[float] = -700.0  # gamma >= e^-700: below it 1/gamma overflows a double

_D = TypeVar("_D")


@dataclass(frozen=True)
class _Model:
    """What the service needs of one distribution kind."""

    log_mean: Callable[[TrialDistribution], float]
    probability: Callable[[TrialDistribution, int], float]
    sample: Callable[[TrialDistribution, random.Random], int]
    curve: Callable[[TrialDistribution, Curve], Curve]


_MODELS: dict[type, _Model] = {}  # filled once at import by _model_for


def _model_for(distribution_type: type[_D], model: _Model) -> None:
    if distribution_type in _MODELS:
        raise RuntimeError(f"trial distribution {distribution_type.__name__} registered twice")
    _MODELS[distribution_type] = model


def _model(distribution: TrialDistribution) -> _Model:
    model = _MODELS.get(type(distribution))
    if model is None:
        raise PrivacyEventError(f"not a trial distribution: {distribution!r}")
    return model


# ----------------------------------------------------------------------------- public helpers


def tuned_curve(distribution: TrialDistribution, trial_curve: Sequence[float]) -> Curve:
    """RDP of releasing the best of K ~ ``distribution`` trials that are each ``trial_curve``-RDP."""
    curve = validate_curve(trial_curve, name="trial RDP curve")
    tuned = _model(distribution).curve(distribution, curve)
    for value in tuned:
        if not math.isfinite(value) or value < 0.0:
            raise PrivacyEventError(f"tuning RDP of {distribution!r} is not a finite non-negative number")
    return tuned


def expected_trials(distribution: TrialDistribution) -> float:
    """E[K], the mean number of trials (inf only for a gamma so small that it overflows)."""
    log_mean = _model(distribution).log_mean(distribution)
    return math.inf if log_mean > 709.0 else math.exp(log_mean)


def trial_count_probability(distribution: TrialDistribution, k: int) -> float:
    """P[K = k]."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise PrivacyEventError(f"a trial count must be an integer, got {k!r}")
    return _model(distribution).probability(distribution, k)


def sample_trial_count(distribution: TrialDistribution, *, rng: random.Random) -> int:
    """One exact draw of K using only ``rng`` (the service passes secrets.SystemRandom())."""
    return _model(distribution).sample(distribution, rng)


def truncated_negative_binomial_for_mean(mean: float, eta: float) -> TruncatedNegativeBinomial:
    """The D_{eta,gamma} with E[K] = mean (to ~1e-12 relative): gamma by bisection on log gamma.

    E[K] falls from +inf to 1 as gamma goes from 0 to 1, so mean must be > 1; it must also be
    reachable with gamma >= e^-700."""
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or not mean > 1.0:
        raise PrivacyEventError(f"the mean number of trials must be a finite number > 1, got {mean!r}")
    TruncatedNegativeBinomial(eta, 0.5)  # validates eta
    eta, target = float(eta), math.log(float(mean))
    lo = -1.0  # log gamma with E[K] >= mean
    while _tnb_log_mean(eta, lo) < target:
        if lo == _MIN_LOG_GAMMA:
            raise PrivacyEventError(f"mean {mean!r} needs gamma < e^{_MIN_LOG_GAMMA:g} at eta = {eta!r}")
        lo = max(2.0 * lo, _MIN_LOG_GAMMA)
    hi = 0.0  # E[K] -> 1 < mean
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _tnb_log_mean(eta, mid) >= target:
            lo = mid
        else:
            hi = mid
    return TruncatedNegativeBinomial(eta, math.exp(lo))


# ----------------------------------------------------------------------------- truncated negative binomial


def _tnb_log_terms(eta: float, log_gamma: float) -> tuple[float, ...]:
    """log E[K] as a sum of terms: E = eta(1-gamma)/(gamma(1-gamma^eta)), (1-gamma)/(gamma log(1/gamma)) at eta = 0."""
    base = (math.log(-math.expm1(log_gamma)), -log_gamma)
    if eta == 0.0:
        return (*base, -math.log(-log_gamma))
    return (*base, math.log(abs(eta)), -_log_abs_expm1(eta * log_gamma))


def _tnb_log_mean(eta: float, log_gamma: float) -> float:
    return math.fsum(_tnb_log_terms(eta, log_gamma))


def _log_abs_expm1(x: float) -> float:
    """log|e^x - 1| for x != 0, without overflow for large x."""
    if x > 30.0:
        return x + math.log1p(-math.exp(-x))
    return math.log(abs(math.expm1(x)))


def _tnb_weight_log(eta: float, log_gamma: float) -> float:
    """log of eta/(gamma^-eta - 1) (1/log(1/gamma) at eta = 0), the pmf's normalisation."""
    if eta == 0.0:
        return -math.log(-log_gamma)
    return math.log(abs(eta)) - _log_abs_expm1(-eta * log_gamma)


def _tnb_probability(distribution: TrialDistribution, k: int) -> float:
    """(1-gamma)^k eta/(gamma^-eta - 1) prod_{l=1}^{k-1} (l+eta)/(l+1): Definition 1 with the l = 0
    factor eta moved into the weight, so eta = 0 (the logarithmic distribution) is the same formula."""
    assert isinstance(distribution, TruncatedNegativeBinomial)
    if k < 1:
        return 0.0
    eta, log_gamma = distribution.eta, math.log(distribution.gamma)
    log_product = math.lgamma(k + eta) - math.lgamma(1.0 + eta) - math.lgamma(k + 1.0)
    return math.exp(k * math.log1p(-distribution.gamma) + _tnb_weight_log(eta, log_gamma) + log_product)


def _tnb_log_mean_of(distribution: TrialDistribution) -> float:
    assert isinstance(distribution, TruncatedNegativeBinomial)
    return _tnb_log_mean(distribution.eta, math.log(distribution.gamma))


def _tnb_curve(distribution: TrialDistribution, curve: Curve) -> Curve:
    assert isinstance(distribution, TruncatedNegativeBinomial)
    scale = 1.0 + distribution.eta
    log_inverse_gamma = -math.log(distribution.gamma)
    # The a_hat term does not depend on a: one minimum over the grid, each candidate rounded up.
    second = min(
        round_up_sum((scale * (1.0 - 1.0 / a_hat) * c_hat, scale * log_inverse_gamma / a_hat))
        for a_hat, c_hat in zip(ORDERS, curve, strict=True)
    )
    log_mean = round_up_sum(_tnb_log_terms(distribution.eta, math.log(distribution.gamma)))
    return tuple(round_up_sum((c_a, second, log_mean / (a - 1.0))) for a, c_a in zip(ORDERS, curve, strict=True))


def _tnb_sample(distribution: TrialDistribution, rng: random.Random) -> int:
    assert isinstance(distribution, TruncatedNegativeBinomial)
    eta, gamma = distribution.eta, distribution.gamma
    if eta == 1.0:
        return _geometric(math.log1p(-gamma), rng)
    if eta == 0.0:
        return _logarithmic(gamma, rng)
    if eta < 0.0:
        return _tnb_below_zero(eta, gamma, rng)
    return _tnb_above_zero(eta, gamma, rng)


def _geometric(log_q: float, rng: random.Random) -> int:
    """K >= 1 with P[K > k] = q^k, by inversion (log q < 0; -inf is q = 0)."""
    if log_q == -math.inf:
        return 1
    uniform = 1.0 - rng.random()  # (0, 1]
    return 1 + math.floor(math.log(uniform) / log_q)


def _logarithmic(gamma: float, rng: random.Random) -> int:
    """P[K = k] = (1-gamma)^k/(k log(1/gamma)) as Kemp's (1981) mixture: K | q is geometric with
    P[K > k] = q^k, q = 1 - gamma^U, U uniform (integrating over q gives the logarithmic pmf)."""
    power = math.exp(rng.random() * math.log(gamma))  # gamma^U in (gamma, 1]
    return 1 if power >= 1.0 else _geometric(math.log1p(-power), rng)


def _tnb_below_zero(eta: float, gamma: float, rng: random.Random) -> int:
    """-1 < eta < 0: rejection from the logarithmic distribution. The pmf ratio is proportional to
    prod_{l=1}^{k-1} (1 + eta/l) = Gamma(k+eta)/(Gamma(1+eta) Gamma(k)), which is <= 1 (= 1 at k = 1)."""
    while True:
        k = _logarithmic(gamma, rng)
        if rng.random() < math.exp(math.lgamma(k + eta) - math.lgamma(1.0 + eta) - math.lgamma(k)):
            return k


def _tnb_above_zero(eta: float, gamma: float, rng: random.Random) -> int:
    """eta > 0: NB(eta, gamma) = Poisson(Gamma(eta, scale (1-gamma)/gamma)) conditioned on K >= 1.

    Two exact rejection schemes; the one with the higher acceptance rate runs: redraw while K = 0
    (acceptance 1 - gamma^eta), or propose 1 + NB(1+eta, gamma) and accept with probability 1/K
    (the pmf ratio; acceptance 1/E[K]), which stays fast as E[K] -> 1."""
    log_gamma = math.log(gamma)
    if -math.expm1(eta * log_gamma) >= math.exp(-_tnb_log_mean(eta, log_gamma)):
        while True:
            k = _negative_binomial(eta, gamma, rng)
            if k >= 1:
                return k
    while True:
        k = 1 + _negative_binomial(1.0 + eta, gamma, rng)
        if rng.random() * k < 1.0:
            return k


def _negative_binomial(shape: float, gamma: float, rng: random.Random) -> int:
    """Failures before ``shape`` successes of probability gamma: P[k] ~ Gamma(k+shape)/k! (1-gamma)^k."""
    return _poisson(rng.gammavariate(shape, (1.0 - gamma) / gamma), rng)


_model_for(
    TruncatedNegativeBinomial,
    _Model(log_mean=_tnb_log_mean_of, probability=_tnb_probability, sample=_tnb_sample, curve=_tnb_curve),
)


# ----------------------------------------------------------------------------- Poisson


def _poisson(mean: float, rng: random.Random) -> int:
    """Exact Poisson(mean) draw: a sum of Knuth draws of at most POISSON_CHUNK each (time ~ mean)."""
    total = 0
    remaining = mean
    while remaining > 0.0:
        chunk = min(remaining, POISSON_CHUNK)
        remaining -= chunk
        threshold = math.exp(-chunk)
        product = rng.random()
        while product > threshold:
            total += 1
            product *= rng.random()
    return total


def _poisson_probability(distribution: TrialDistribution, k: int) -> float:
    assert isinstance(distribution, PoissonTrials)
    if k < 0:
        return 0.0
    mean = distribution.mean
    return math.exp(k * math.log(mean) - mean - math.lgamma(k + 1.0))


def _poisson_log_mean(distribution: TrialDistribution) -> float:
    assert isinstance(distribution, PoissonTrials)
    return math.log(distribution.mean)


def _poisson_sample(distribution: TrialDistribution, rng: random.Random) -> int:
    assert isinstance(distribution, PoissonTrials)
    return _poisson(distribution.mean, rng)


def _poisson_curve(distribution: TrialDistribution, curve: Curve) -> Curve:
    assert isinstance(distribution, PoissonTrials)
    mean = distribution.mean
    log_mean = round_up(math.log(mean))  # >= 0: mean >= 1
    out = []
    for a, c_a in zip(ORDERS, curve, strict=True):
        delta_hat = delta_from_rdp(curve, _largest_epsilon_hat(a))
        out.append(round_up_sum((c_a, round_up(mean * delta_hat), log_mean / (a - 1.0))))
    return tuple(out)


def _largest_epsilon_hat(order: float) -> float:
    """log(a/(a-1)), rounded down so that e^eps_hat <= 1 + 1/(a-1) holds despite float error (a
    smaller eps_hat only raises delta_hat)."""
    value = -math.log1p(-1.0 / order)
    return math.nextafter(value - value * RELATIVE_SLACK, 0.0)


_model_for(
    PoissonTrials,
    _Model(log_mean=_poisson_log_mean, probability=_poisson_probability, sample=_poisson_sample, curve=_poisson_curve),
)


# ----------------------------------------------------------------------------- a public maximum

TRUNCATION_SLACK: Final[float] = 1e-9
"""Relative slack on the sums behind a truncation's cost. Each pmf term is an exp of a few lgamma
and log terms whose absolute error stays below 1e-11 for k <= MAX_TRIALS_LIMIT; math.fsum adds
them exactly; the closed-form mean is accurate to ~1e-15. 1e-9 dominates all of it."""

MIN_TRUNCATED_MASS: Final[float] = 0.5
"""A maximum must keep at least half of the distribution: below its median the conditioning would
cost more than log 2/(a-1) at every order and the rejection sampler could loop for long."""

DEFAULT_SHARE_KEPT: Final[float] = 0.99
"""The default maximum keeps 99% of E[K] (rho >= 0.99): its surcharge is at most log(1/0.99) ~ 0.01."""


@dataclass(frozen=True)
class Truncation:
    """What conditioning K ~ D on K <= M costs, both terms rounded up (docs/privacy-model.md#tuning):

    * ``log_inverse_share`` = log(E[K] / E[K; K <= M]) = log(1/rho), added at every order;
    * ``log_inverse_mass`` = log(1 / P[K <= M]) = log(1/Z), added divided by (a - 1).

    ``mass`` and ``mean`` are the conditioned distribution's P[K <= M] and E[K | K <= M] (for
    display; the cost uses the rounded terms)."""

    log_inverse_share: float
    log_inverse_mass: float
    mass: float
    mean: float


def _head_sums(unbounded: TrialDistribution, maximum: int) -> tuple[float, float]:
    """P[K <= maximum] and E[K; K <= maximum] of an unbounded distribution, by exact summation."""
    model = _model(unbounded)
    probabilities = [model.probability(unbounded, k) for k in range(maximum + 1)]
    return math.fsum(probabilities), math.fsum(k * p for k, p in enumerate(probabilities))


@functools.lru_cache(maxsize=256)
def truncation(distribution: BoundedTrialDistribution) -> Truncation:
    """The cost terms of a bounded distribution; raises when its maximum keeps less than half of it."""
    unbounded = distribution.unbounded
    mass, head_mean = _head_sums(unbounded, distribution.maximum)
    mass_low = min(1.0, mass * (1.0 - TRUNCATION_SLACK))
    if not mass_low >= MIN_TRUNCATED_MASS:
        raise PrivacyEventError(
            f"a maximum of {distribution.maximum} trials keeps only {mass:.3g} of the distribution's mass: "
            f"it must be at least its median (keep at least {MIN_TRUNCATED_MASS:g})"
        )
    mean_high = round_up(round_up(math.exp(_model(unbounded).log_mean(unbounded))) * (1.0 + TRUNCATION_SLACK))
    head_low = min(mean_high, head_mean * (1.0 - TRUNCATION_SLACK))
    return Truncation(
        log_inverse_share=round_up(math.log(mean_high) - math.log(head_low)) if head_low > 0.0 else 0.0,
        log_inverse_mass=round_up(-math.log(mass_low)),
        mass=mass,
        mean=head_mean / mass,
    )


def default_maximum(distribution: TrialDistribution, *, cap: int) -> int:
    """The smallest maximum whose conditioning keeps DEFAULT_SHARE_KEPT of E[K] (a surcharge of at
    most ~0.01 at every order), but at most ``cap`` (the service's limit on slots)."""
    if not 1 <= cap <= MAX_TRIALS_LIMIT:
        raise PrivacyEventError(f"the cap on the maximum must be from 1 to {MAX_TRIALS_LIMIT}, got {cap!r}")
    model = _model(distribution)
    target = DEFAULT_SHARE_KEPT * math.exp(model.log_mean(distribution))
    head = 0.0
    for k in range(1, cap + 1):
        head += k * model.probability(distribution, k)
        if head >= target:
            return k
    return cap


def _conditioned_mean(unbounded: TrialDistribution, maximum: int) -> float:
    mass, head = _head_sums(unbounded, maximum)
    return head / mass if mass > 0.0 else 0.0


def _solve_increasing(mean_at: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """The x in [lo, hi] with mean_at(x) = target (to ~1e-12), for mean_at increasing in x."""
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if mean_at(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def bounded_for_mean(
    kind: str, *, mean: float, maximum: int | None, cap: int, eta: float = 0.0
) -> BoundedTrialDistribution:
    """The distribution of ``kind`` ("truncated-negative-binomial" with shape ``eta``, or
    "poisson") conditioned on K <= maximum whose conditioned mean E[K | K <= maximum] is ``mean``.
    Without a maximum, the default one (:func:`default_maximum`, at most ``cap``) for the
    unbounded distribution of that mean. Raises when the mean is out of reach of the maximum, or
    the maximum keeps less than half of the distribution."""
    if isinstance(mean, bool) or not isinstance(mean, (int, float)) or not math.isfinite(mean) or not mean > 1.0:
        raise PrivacyEventError(f"the mean number of trials must be a finite number > 1, got {mean!r}")
    bounded: BoundedTrialDistribution
    if kind == "poisson":
        if maximum is None:
            maximum = default_maximum(PoissonTrials(mean=mean), cap=cap)
        top = _conditioned_mean(PoissonTrials(mean=4.0 * maximum + 64.0), maximum)
        if not mean < top:
            raise PrivacyEventError(f"a mean of {mean:g} trials is out of reach with at most {maximum}")
        mu = _solve_increasing(
            lambda m: _conditioned_mean(PoissonTrials(mean=m), maximum), 1.0, 4.0 * maximum + 64.0, mean
        )
        bounded = BoundedPoissonTrials(mean=mu, maximum=maximum)
    elif kind == "truncated-negative-binomial":
        TruncatedNegativeBinomial(eta, 0.5)  # validates eta
        top_k = (
            maximum
            if maximum is not None
            else default_maximum(truncated_negative_binomial_for_mean(mean, eta), cap=cap)
        )

        def tnb(x: float) -> TruncatedNegativeBinomial:
            """x = log(1/gamma): the conditioned mean grows with it."""
            return TruncatedNegativeBinomial(eta, math.exp(-x))

        def tnb_mean(x: float) -> float:
            return _conditioned_mean(tnb(x), top_k)

        top = tnb_mean(-_MIN_LOG_GAMMA)
        if not mean < top:
            raise PrivacyEventError(
                f"a mean of {mean:g} trials is out of reach with at most {top_k} for this distribution "
                f"(at most {top:.3g}): raise the maximum"
            )
        unbounded = tnb(_solve_increasing(tnb_mean, 1e-12, -_MIN_LOG_GAMMA, mean))
        bounded = BoundedTruncatedNegativeBinomial(eta=unbounded.eta, gamma=unbounded.gamma, maximum=top_k)
    else:
        raise PrivacyEventError(f"unknown trial distribution {kind!r}")
    truncation(bounded)  # refuses a maximum below the median
    return bounded


def _bounded_probability(distribution: TrialDistribution, k: int) -> float:
    assert isinstance(distribution, (BoundedTruncatedNegativeBinomial, BoundedPoissonTrials))
    if k > distribution.maximum:
        return 0.0
    return _model(distribution.unbounded).probability(distribution.unbounded, k) / truncation(distribution).mass


def _bounded_log_mean(distribution: TrialDistribution) -> float:
    assert isinstance(distribution, (BoundedTruncatedNegativeBinomial, BoundedPoissonTrials))
    return math.log(truncation(distribution).mean)


def _bounded_sample(distribution: TrialDistribution, rng: random.Random) -> int:
    """Rejection: draws of the unbounded distribution until one is <= maximum, which is exactly K
    conditioned on K <= maximum (at most 2 draws on average: the maximum keeps half the mass)."""
    assert isinstance(distribution, (BoundedTruncatedNegativeBinomial, BoundedPoissonTrials))
    truncation(distribution)  # refuses a maximum below the median before any loop
    unbounded = distribution.unbounded
    while True:
        k = _model(unbounded).sample(unbounded, rng)
        if k <= distribution.maximum:
            return k


def _bounded_curve(distribution: TrialDistribution, curve: Curve) -> Curve:
    """The unbounded distribution's tuned curve plus log(1/rho) + log(1/Z)/(a - 1).

    Why it holds: with f the probability generating function of K and f_M that of K | K <= M,
    rho f'(t)/Z <= f_M'(t) <= f'(t)/Z on [0, 1] (every term of f' above degree M - 1 grows faster
    in t than every term below, so the share kept is smallest at t = 1, where it is rho). The
    probability of each output of best-of-K is an average of f' over an interval of [0, 1] times a
    trial's own probability, so P_M <= P/Z on one dataset and P'_M >= rho P'/Z on the other; in the
    Rényi sum of P_M^a P'_M^(1-a) that is at most rho^(1-a)/Z times the unbounded sum."""
    assert isinstance(distribution, (BoundedTruncatedNegativeBinomial, BoundedPoissonTrials))
    cost = truncation(distribution)
    unbounded = distribution.unbounded
    base = _model(unbounded).curve(unbounded, curve)
    return tuple(
        round_up_sum((value, cost.log_inverse_share, cost.log_inverse_mass / (a - 1.0)))
        for a, value in zip(ORDERS, base, strict=True)
    )


for _bounded_type in (BoundedTruncatedNegativeBinomial, BoundedPoissonTrials):
    _model_for(
        _bounded_type,
        _Model(
            log_mean=_bounded_log_mean,
            probability=_bounded_probability,
            sample=_bounded_sample,
            curve=_bounded_curve,
        ),
    )
