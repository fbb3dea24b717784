"""Private hyperparameter tuning (Papernot & Steinke 2022): the trial-count distributions and the
RDP of "run K trials, release only the best" (docs/privacy-model.md#tuning).

K is drawn independently of the data and never released. Each trial runs a candidate chosen at
random independently of the data, so one trial is (a, c(a))-RDP with c the order-wise maximum of
the candidates' curves (:mod:`app.privacy.rdp` forms c; Rényi divergence is jointly quasi-convex).
With c on the grid ORDERS the tuned mechanism is (a, c'(a))-RDP where, for

* K ~ D_{eta,gamma}, the truncated negative binomial (their Theorem 2, any a_hat >= 1; the grid's):
  c'(a) = c(a) + min_{a_hat} [(1+eta)(1 - 1/a_hat) c(a_hat) + (1+eta) log(1/gamma)/a_hat] + log E[K]/(a-1);
* K ~ Poisson(mu) (their Theorem 6): c'(a) = c(a) + mu delta_hat + log(mu)/(a-1), where one trial is
  (eps_hat, delta_hat)-DP with e^eps_hat <= a/(a-1); delta_hat is the CKS conversion of
  :mod:`app.privacy.conversion` solved for delta at eps_hat = log(a/(a-1)), minimised over the grid.
  Only mu >= 1: below it the bound is false (a data-independent trial would get a negative cost,
  and tests/unit/privacy/test_privacy_tuning.py finds exact divergences above it).

Each distribution kind registers one :class:`_Model` (mean, pmf, sampler, curve), so adding a kind
is one block, not an if/elif in every function. Costs are rounded up (app.privacy.rounding).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from app.privacy.curves import validate_curve
from app.privacy.errors import PrivacyEventError
from app.privacy.events import PoissonTrials, TrialDistribution, TruncatedNegativeBinomial
from app.privacy.orders import ORDERS, Curve
from app.privacy.rounding import RELATIVE_SLACK, round_up, round_up_sum

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
        delta_hat = _delta_at(curve, _largest_epsilon_hat(a))
        out.append(round_up_sum((c_a, round_up(mean * delta_hat), log_mean / (a - 1.0))))
    return tuple(out)


def _largest_epsilon_hat(order: float) -> float:
    """log(a/(a-1)), rounded down so that e^eps_hat <= 1 + 1/(a-1) holds despite float error (a
    smaller eps_hat only raises delta_hat)."""
    value = -math.log1p(-1.0 / order)
    return math.nextafter(value - value * RELATIVE_SLACK, 0.0)


def _delta_at(curve: Curve, epsilon: float) -> float:
    """The smallest delta over the grid with (epsilon, delta)-DP by the conversion of
    app.privacy.conversion solved for delta: log delta = (a-1)(c(a) + log(1-1/a) - epsilon) - log a.
    Rounded up; 1 (always valid) where the conversion gives more."""
    best = 1.0
    for order, value in zip(ORDERS, curve, strict=True):
        w = order - 1.0
        log_delta = round_up_sum((w * value, w * math.log1p(-1.0 / order), -w * epsilon, -math.log(order)))
        if log_delta < 0.0:
            best = min(best, round_up(math.exp(log_delta)))
    return best


_model_for(
    PoissonTrials,
    _Model(log_mean=_poisson_log_mean, probability=_poisson_probability, sample=_poisson_sample, curve=_poisson_curve),
)
