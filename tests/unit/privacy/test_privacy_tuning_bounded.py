"""Trial counts with a public maximum (kernel/privacy/tuning.py): K conditioned on K <= M, its exact
pmf and sampler, the two surcharge terms against closed forms, the bound against the exact
divergence of the truncated best-of-K on finite mechanisms, and the mean-solving constructor."""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable, Iterator

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from kernel.privacy import (
    ORDERS,
    HyperparameterTuningEvent,
    PrivacyEventError,
    PureDPEvent,
    event_from_json,
    event_to_json,
    expected_trials,
    rdp_curve,
    sample_trial_count,
    trial_count_probability,
    tuned_curve,
)
from kernel.privacy.events import (
    BoundedPoissonTrials,
    BoundedTrialDistribution,
    BoundedTruncatedNegativeBinomial,
    PoissonTrials,
    TruncatedNegativeBinomial,
)
from kernel.privacy.tuning import (
    DEFAULT_SHARE_KEPT,
    MIN_TRUNCATED_MASS,
    bounded_for_mean,
    default_maximum,
    truncation,
)
from tests.unit.privacy.test_privacy_tuning import Pmf, _exact_curve, _toy_pairs

BOUNDED_CASES: list[BoundedTrialDistribution] = [
    BoundedTruncatedNegativeBinomial(0.0, 0.3, 2),
    BoundedTruncatedNegativeBinomial(0.0, 0.05, 25),
    BoundedTruncatedNegativeBinomial(1.0, 0.2, 4),
    BoundedTruncatedNegativeBinomial(-0.5, 0.1, 10),
    BoundedTruncatedNegativeBinomial(3.0, 0.5, 6),
    BoundedPoissonTrials(2.0, 3),
    BoundedPoissonTrials(5.0, 12),
    BoundedPoissonTrials(1.0, 1),
]


@pytest.fixture(autouse=True)
def _fifty_digits() -> Iterator[None]:
    with mpmath.workdps(50):
        yield


# ----------------------------------------------------------------------------- the distribution


@pytest.mark.parametrize("distribution", BOUNDED_CASES, ids=repr)
def test_the_pmf_is_the_unbounded_one_conditioned_on_the_maximum(distribution: BoundedTrialDistribution) -> None:
    unbounded = distribution.unbounded
    kept = math.fsum(trial_count_probability(unbounded, k) for k in range(distribution.maximum + 1))
    for k in range(distribution.maximum + 3):
        expected = trial_count_probability(unbounded, k) / kept if k <= distribution.maximum else 0.0
        assert trial_count_probability(distribution, k) == pytest.approx(expected, rel=1e-12, abs=0)
    total = math.fsum(trial_count_probability(distribution, k) for k in range(distribution.maximum + 1))
    assert total == pytest.approx(1.0, rel=1e-12)
    mean = math.fsum(k * trial_count_probability(distribution, k) for k in range(distribution.maximum + 1))
    assert expected_trials(distribution) == pytest.approx(mean, rel=1e-12)


@pytest.mark.parametrize("distribution", BOUNDED_CASES[1::2], ids=repr)
def test_the_sampler_draws_the_conditioned_distribution(distribution: BoundedTrialDistribution) -> None:
    rng = random.Random(20261128)
    draws = 20000
    counts = [0] * (distribution.maximum + 1)
    for _ in range(draws):
        k = sample_trial_count(distribution, rng=rng)
        assert 0 <= k <= distribution.maximum
        counts[k] += 1
    expected = [draws * trial_count_probability(distribution, k) for k in range(distribution.maximum + 1)]
    cells = [(o, e) for o, e in zip(counts, expected, strict=True) if e >= 20]
    lumped = (draws - sum(o for o, _ in cells), draws - math.fsum(e for _, e in cells))
    if lumped[1] > 0:
        cells.append(lumped)
    statistic = sum((o - e) ** 2 / e for o, e in cells)
    assert statistic < stats.chi2.ppf(1 - 1e-6, df=len(cells) - 1)
    assert sample_trial_count(distribution, rng=secrets.SystemRandom()) <= distribution.maximum


@pytest.mark.parametrize("gamma", [0.05, 0.2, 0.6])
@pytest.mark.parametrize("maximum", [1, 3, 20])
def test_the_surcharge_of_a_geometric_count_is_its_closed_form(gamma: float, maximum: int) -> None:
    """Geometric K (eta = 1): P[K <= M] = 1 - (1-g)^M and E[K; K > M]/E[K] = (1-g)^M (M g + 1)."""
    bounded = BoundedTruncatedNegativeBinomial(1.0, gamma, maximum)
    tail = (1 - gamma) ** maximum
    if 1 - tail < MIN_TRUNCATED_MASS:
        with pytest.raises(PrivacyEventError, match="at least its median"):
            truncation(bounded)
        return
    cost = truncation(bounded)
    share = -math.log1p(-tail * (maximum * gamma + 1))
    mass = -math.log1p(-tail)
    assert share <= cost.log_inverse_share <= share + 1e-8  # rounded up, by little
    assert mass <= cost.log_inverse_mass <= mass + 1e-8


@pytest.mark.parametrize("mean", [1.5, 4.0, 30.0])
@pytest.mark.parametrize("extra", [1, 4, 40])
def test_the_surcharge_of_a_poisson_count_is_its_closed_form(mean: float, extra: int) -> None:
    """Poisson K: P[K <= M] is its cdf and E[K; K <= M] = mu P[K <= M - 1]."""
    maximum = math.ceil(mean) + extra
    cost = truncation(BoundedPoissonTrials(mean, maximum))
    mass = -math.log(stats.poisson.cdf(maximum, mean))
    share = -math.log(stats.poisson.cdf(maximum - 1, mean))
    assert share - 1e-12 <= cost.log_inverse_share <= share + 1e-8
    assert mass - 1e-12 <= cost.log_inverse_mass <= mass + 1e-8


@pytest.mark.parametrize("distribution", BOUNDED_CASES, ids=repr)
def test_the_curve_is_the_unbounded_curve_plus_the_surcharge(distribution: BoundedTrialDistribution) -> None:
    trial = [0.1 * a for a in ORDERS]
    base = tuned_curve(distribution.unbounded, trial)
    cost = truncation(distribution)
    for a, value, before in zip(ORDERS, tuned_curve(distribution, trial), base, strict=True):
        assert value >= before + cost.log_inverse_share + cost.log_inverse_mass / (a - 1)
        assert value == pytest.approx(before + cost.log_inverse_share + cost.log_inverse_mass / (a - 1), rel=1e-9)


# ----------------------------------------------------------------------------- exact check on finite mechanisms


def _bounded_pgf(distribution: BoundedTrialDistribution) -> Callable[[mpmath.mpf], mpmath.mpf]:
    """E[x^K] of K conditioned on K <= M, summed exactly from the unbounded pmf."""
    unbounded = distribution.unbounded
    weights = [mpmath.mpf(trial_count_probability(unbounded, k)) for k in range(distribution.maximum + 1)]
    kept = mpmath.fsum(weights)
    return lambda x: mpmath.fsum(w * x**k for k, w in enumerate(weights)) / kept


def _best_of_k(p: Pmf, distribution: BoundedTrialDistribution) -> Pmf:
    """Output pmf of 'K trials, release the largest', K conditioned on K <= M and hidden: P[best
    <= y] = PGF_M(F(y)); K = 0 (Poisson) releases a fixed 'nothing'."""
    pgf = _bounded_pgf(distribution)
    out = [pgf(mpmath.mpf(0))] if isinstance(distribution, BoundedPoissonTrials) else []
    below = mpmath.mpf(0)
    for mass in p:
        out.append(pgf(below + mass) - pgf(below))
        below += mass
    return out


@pytest.mark.parametrize("distribution", BOUNDED_CASES, ids=repr)
def test_the_bound_is_above_the_exact_divergence_of_the_truncated_best_trial(
    distribution: BoundedTrialDistribution,
) -> None:
    for p, q in _toy_pairs():
        trial = _exact_curve(p, q)
        bound = tuned_curve(distribution, trial)
        exact = _exact_curve(_best_of_k(p, distribution), _best_of_k(q, distribution))
        for a, value, truth in zip(ORDERS, bound, exact, strict=True):
            assert truth <= value, (a, truth, value)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.floats(0.05, 1.0), min_size=2, max_size=4),
    tilt=st.floats(0.2, 1.5),
    gamma=st.floats(0.05, 0.6),
    eta=st.sampled_from([-0.5, 0.0, 1.0, 2.0]),
    maximum=st.integers(1, 12),
)
def test_the_bound_holds_for_random_mechanisms_and_maximums(
    weights: list[float], tilt: float, gamma: float, eta: float, maximum: int
) -> None:
    """Random ordered output distributions and their exponentially tilted neighbours (a mechanism
    whose privacy loss grows with the score), with random shapes and maximums."""
    p = [mpmath.mpf(w) for w in weights]
    q = [w * mpmath.exp(tilt * i) for i, w in enumerate(p)]
    p = [w / mpmath.fsum(p) for w in p]
    q = [w / mpmath.fsum(q) for w in q]
    distribution = BoundedTruncatedNegativeBinomial(eta, gamma, maximum)
    try:
        truncation(distribution)
    except PrivacyEventError:  # a maximum below the median: refused, nothing to check
        return
    bound = tuned_curve(distribution, _exact_curve(p, q))
    exact = _exact_curve(_best_of_k(p, distribution), _best_of_k(q, distribution))
    assert all(truth <= value for truth, value in zip(exact, bound, strict=True))


def test_a_large_maximum_costs_almost_nothing_more() -> None:
    """Not vacuous the other way either: keeping 99% of E[K] adds at most ~0.01 at every order."""
    unbounded = TruncatedNegativeBinomial(0.0, 0.05)
    maximum = default_maximum(unbounded, cap=10_000)
    cost = truncation(BoundedTruncatedNegativeBinomial(0.0, 0.05, maximum))
    assert cost.log_inverse_share <= -math.log(DEFAULT_SHARE_KEPT) + 1e-8
    assert cost.log_inverse_mass < 0.002
    assert default_maximum(unbounded, cap=10) == 10  # capped by the service


# ----------------------------------------------------------------------------- solving for a mean


@pytest.mark.parametrize(
    ("kind", "mean", "maximum", "eta"),
    [
        ("truncated-negative-binomial", 2.0, 6, 0.0),
        ("truncated-negative-binomial", 5.0, None, 1.0),
        ("truncated-negative-binomial", 1.2, 3, -0.5),
        ("poisson", 2.0, 4, 0.0),
        ("poisson", 8.0, None, 0.0),
    ],
)
def test_bounded_for_mean_hits_the_mean_under_the_maximum(
    kind: str, mean: float, maximum: int | None, eta: float
) -> None:
    distribution = bounded_for_mean(kind, mean=mean, maximum=maximum, cap=100, eta=eta)
    assert expected_trials(distribution) == pytest.approx(mean, rel=1e-9)
    if maximum is not None:
        assert distribution.maximum == maximum
    assert truncation(distribution).mass >= MIN_TRUNCATED_MASS


def test_bounded_for_mean_refuses_what_no_maximum_can_give() -> None:
    with pytest.raises(PrivacyEventError, match="out of reach with at most 4"):
        bounded_for_mean("truncated-negative-binomial", mean=3.0, maximum=4, cap=100)
    with pytest.raises(PrivacyEventError, match="keeps only"):
        bounded_for_mean("poisson", mean=2.5, maximum=3, cap=100)
    with pytest.raises(PrivacyEventError, match="> 1"):
        bounded_for_mean("poisson", mean=1.0, maximum=3, cap=100)
    with pytest.raises(PrivacyEventError, match="unknown trial distribution"):
        bounded_for_mean("uniform", mean=2.0, maximum=3, cap=100)


# ----------------------------------------------------------------------------- events and JSON


@pytest.mark.parametrize("maximum", [0, -1, 2.5, 10_001, True, math.nan])
def test_a_maximum_must_be_a_whole_number_in_range(maximum: object) -> None:
    with pytest.raises(PrivacyEventError):
        BoundedPoissonTrials(2.0, maximum)  # type: ignore[arg-type]
    with pytest.raises(PrivacyEventError):
        BoundedTruncatedNegativeBinomial(0.0, 0.5, maximum)  # type: ignore[arg-type]


def test_bounded_events_round_trip_through_json_and_price_higher_than_unbounded() -> None:
    for distribution in BOUNDED_CASES:
        event = HyperparameterTuningEvent(distribution, (PureDPEvent(1.0, 1),))
        stored = event_to_json(event)
        assert stored["event"]["distribution"]["maximum"] == distribution.maximum
        assert isinstance(stored["event"]["distribution"]["maximum"], int)
        assert event_from_json(stored) == event
        unbounded = HyperparameterTuningEvent(distribution.unbounded, (PureDPEvent(1.0, 1),))
        assert all(b >= u for b, u in zip(rdp_curve(event), rdp_curve(unbounded), strict=True))
    assert BoundedPoissonTrials(2.0, 3).unbounded == PoissonTrials(2.0)
