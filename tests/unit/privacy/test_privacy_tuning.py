"""Private hyperparameter tuning: the trial distributions, their sampler, the tuned RDP curve
(golden values and an exact check on a finite mechanism), the event's JSON and its consumers."""

from __future__ import annotations

import copy
import json
import math
import random
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from kernel.privacy import (
    ORDERS,
    ComposedEvent,
    GaussianEvent,
    HyperparameterTuningEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PoissonTrials,
    PrivacyEvent,
    PrivacyEventError,
    PureDPEvent,
    TrialDistribution,
    TruncatedNegativeBinomial,
    ZCDPEvent,
    capped_single_job_epsilon,
    epsilon_from_rdp,
    event_from_json,
    event_to_json,
    expected_trials,
    ledger_epsilon,
    prv_epsilon,
    rdp_curve,
    sample_trial_count,
    single_job_epsilon,
    trial_count_probability,
    truncated_negative_binomial_for_mean,
    tuned_curve,
)
from kernel.privacy.curves import max_curves
from kernel.privacy.event_json import MAX_COMPOSITION_DEPTH
from kernel.privacy.events import contains_tuning, iter_leaves
from kernel.privacy.single_job import pld_epsilon, rdp_single_job_epsilon

DELTA = 1e-5
ETAS = (-0.5, 0.0, 0.5, 1.0, 3.0)
TNB_CASES = [TruncatedNegativeBinomial(eta, gamma) for eta in ETAS for gamma in (0.02, 0.3, 0.9)]
POISSON_CASES = [PoissonTrials(mean) for mean in (1.0, 3.0, 20.0)]


def _tuning(distribution: TrialDistribution, *candidates: PrivacyEvent) -> HyperparameterTuningEvent:
    return HyperparameterTuningEvent(distribution, candidates)


# ----------------------------------------------------------------------------- independent formulas


def _definition_1_pmf(eta: float, gamma: float, k: int) -> float:
    """Papernot-Steinke Definition 1, written out as stated (product form, logarithmic at eta = 0)."""
    if eta == 0.0:
        return (1.0 - gamma) ** k / (k * math.log(1.0 / gamma))
    product = math.prod((i + eta) / (i + 1.0) for i in range(k))
    return (1.0 - gamma) ** k / (gamma**-eta - 1.0) * product


def _textbook_mean(eta: float, gamma: float) -> float:
    if eta == 0.0:
        return (1.0 - gamma) / (gamma * math.log(1.0 / gamma))
    return eta * (1.0 - gamma) / (gamma * (1.0 - gamma**eta))


def _gaussian_curve(sigma: float) -> list[float]:
    return [a / (2.0 * sigma * sigma) for a in ORDERS]


def _theorem_2(eta: float, gamma: float, curve: Sequence[float]) -> list[float]:
    second = min(
        (1.0 + eta) * (1.0 - 1.0 / ah) * ch + (1.0 + eta) * math.log(1.0 / gamma) / ah
        for ah, ch in zip(ORDERS, curve, strict=True)
    )
    log_mean = math.log(_textbook_mean(eta, gamma))
    return [c + second + log_mean / (a - 1.0) for a, c in zip(ORDERS, curve, strict=True)]


def _theorem_6(mean: float, curve: Sequence[float]) -> list[float]:
    out = []
    for a, c in zip(ORDERS, curve, strict=True):
        eps_hat = math.log(1.0 + 1.0 / (a - 1.0))
        delta_hat = min(
            min(1.0, math.exp(min(0.0, (b - 1.0) * (cb + math.log(1.0 - 1.0 / b) - eps_hat) - math.log(b))))
            for b, cb in zip(ORDERS, curve, strict=True)
        )
        out.append(c + mean * delta_hat + math.log(mean) / (a - 1.0))
    return out


# ----------------------------------------------------------------------------- golden values


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("gamma", [0.05, 0.5])
@pytest.mark.parametrize("sigma", [0.8, 3.0])
def test_truncated_negative_binomial_curve_is_theorem_2_on_the_grid(eta: float, gamma: float, sigma: float) -> None:
    event = _tuning(TruncatedNegativeBinomial(eta, gamma), GaussianEvent(sigma, 1))
    expected = _theorem_2(eta, gamma, _gaussian_curve(sigma))
    got = rdp_curve(event)
    for value, exact in zip(got, expected, strict=True):
        assert value >= exact
        assert value == pytest.approx(exact, rel=1e-10)


@pytest.mark.parametrize("mean", [1.0, 4.0, 50.0])
@pytest.mark.parametrize("sigma", [0.8, 3.0])
def test_poisson_curve_is_theorem_6_on_the_grid(mean: float, sigma: float) -> None:
    event = _tuning(PoissonTrials(mean), GaussianEvent(sigma, 1))
    expected = _theorem_6(mean, _gaussian_curve(sigma))
    for value, exact in zip(rdp_curve(event), expected, strict=True):
        assert value >= exact
        assert value == pytest.approx(exact, rel=1e-9, abs=1e-300)


def test_poisson_delta_hat_is_a_valid_delta_of_the_gaussian() -> None:
    """At mean 1 the tuned curve is c + delta_hat: delta_hat, from a conversion, is at least the
    Gaussian's exact delta at eps_hat = log(a/(a-1))."""
    sigma = 2.0
    mu = 1.0 / sigma
    tuned = rdp_curve(_tuning(PoissonTrials(1.0), GaussianEvent(sigma, 1)))
    for a, value, c in zip(ORDERS, tuned, _gaussian_curve(sigma), strict=True):
        eps_hat = math.log(a / (a - 1.0))
        exact = stats.norm.cdf(-eps_hat / mu + mu / 2) - math.exp(eps_hat) * stats.norm.cdf(-eps_hat / mu - mu / 2)
        assert value - c >= exact > 0.0


def test_grid_minimum_is_close_to_autodp_continuous_minimum() -> None:
    """autodp's RDP_selection_TNB minimises over every a_hat in [1, 1000]; the grid minimum is that
    bound or slightly above it (never below: the same theorem, fewer a_hat)."""
    sigma, eta, gamma = 1.5, 0.5, 0.1
    event = _tuning(TruncatedNegativeBinomial(eta, gamma), GaussianEvent(sigma, 1))

    def second(a_hat: float) -> float:
        return (1 + eta) * (1 - 1 / a_hat) * a_hat / (2 * sigma**2) + (1 + eta) * math.log(1 / gamma) / a_hat

    best = optimize.minimize_scalar(second, method="bounded", bounds=(1.0, 1000.0)).fun
    for a, value in zip(ORDERS, rdp_curve(event), strict=True):
        autodp = a / (2 * sigma**2) + best + math.log(_textbook_mean(eta, gamma)) / (a - 1)
        assert autodp <= value <= autodp * 1.02


# ----------------------------------------------------------------------------- distributions


@pytest.mark.parametrize("distribution", TNB_CASES, ids=repr)
def test_truncated_negative_binomial_pmf_matches_definition_1_and_its_mean(
    distribution: TruncatedNegativeBinomial,
) -> None:
    eta, gamma = distribution.eta, distribution.gamma
    top = 6000 if gamma < 0.05 else 800
    probabilities = [trial_count_probability(distribution, k) for k in range(1, top)]
    for k in (1, 2, 3, 7, 20):
        assert probabilities[k - 1] == pytest.approx(_definition_1_pmf(eta, gamma, k), rel=1e-10)
    assert trial_count_probability(distribution, 0) == 0.0
    assert math.fsum(probabilities) == pytest.approx(1.0, abs=1e-9)
    mean = math.fsum(k * p for k, p in enumerate(probabilities, start=1))
    assert expected_trials(distribution) == pytest.approx(mean, rel=1e-7)
    assert expected_trials(distribution) == pytest.approx(_textbook_mean(eta, gamma), rel=1e-12)


def test_special_cases_of_the_truncated_negative_binomial() -> None:
    geometric = TruncatedNegativeBinomial(1.0, 0.25)
    assert expected_trials(geometric) == pytest.approx(4.0, rel=1e-14)
    assert trial_count_probability(geometric, 3) == pytest.approx(0.25 * 0.75**2, rel=1e-14)
    logarithmic = TruncatedNegativeBinomial(0.0, 0.5)
    assert trial_count_probability(logarithmic, 2) == pytest.approx(0.25 / (2 * math.log(2.0)), rel=1e-14)
    # eta -> 0 is continuous: the mean at eta = 1e-9 is the logarithmic mean.
    assert expected_trials(TruncatedNegativeBinomial(1e-9, 0.5)) == pytest.approx(
        expected_trials(logarithmic), rel=1e-8
    )


@pytest.mark.parametrize("distribution", POISSON_CASES, ids=repr)
def test_poisson_pmf_sums_to_one(distribution: PoissonTrials) -> None:
    probabilities = [trial_count_probability(distribution, k) for k in range(200)]
    assert math.fsum(probabilities) == pytest.approx(1.0, abs=1e-12)
    assert expected_trials(distribution) == pytest.approx(distribution.mean)
    assert trial_count_probability(distribution, -1) == 0.0


@pytest.mark.parametrize("eta", ETAS + (-0.9, 10.0))
@pytest.mark.parametrize("mean", [1.001, 1.5, 5.0, 10.0, 100.0, 1e4])
def test_gamma_for_a_mean_round_trips(eta: float, mean: float) -> None:
    distribution = truncated_negative_binomial_for_mean(mean, eta)
    assert distribution.eta == eta
    assert expected_trials(distribution) == pytest.approx(mean, rel=1e-9)
    if eta == 1.0:
        assert distribution.gamma == pytest.approx(1.0 / mean, rel=1e-9)


@pytest.mark.parametrize("mean", [1.0, 0.5, 0.0, -3.0, math.nan, math.inf, True, "5"])
def test_gamma_for_a_mean_refuses_means_not_above_one(mean: Any) -> None:
    with pytest.raises(PrivacyEventError):
        truncated_negative_binomial_for_mean(mean, 1.0)


def test_gamma_for_a_mean_refuses_a_bad_eta_or_an_unreachable_mean() -> None:
    with pytest.raises(PrivacyEventError):
        truncated_negative_binomial_for_mean(10.0, -1.0)
    with pytest.raises(PrivacyEventError):
        truncated_negative_binomial_for_mean(1e300, -0.999)


# ----------------------------------------------------------------------------- sampler


SAMPLED = [
    TruncatedNegativeBinomial(1.0, 0.2),
    TruncatedNegativeBinomial(0.0, 0.1),
    TruncatedNegativeBinomial(-0.5, 0.05),
    TruncatedNegativeBinomial(0.5, 0.1),
    TruncatedNegativeBinomial(3.0, 0.5),
    TruncatedNegativeBinomial(2.0, 0.97),  # E[K] ~ 1.03: the 1/K-acceptance scheme
    PoissonTrials(1.0),
    PoissonTrials(7.5),
    PoissonTrials(100.0),  # several Knuth chunks
]


@pytest.mark.parametrize("distribution", SAMPLED, ids=repr)
def test_sampler_matches_the_pmf(distribution: TrialDistribution) -> None:
    rng = random.Random(20220425)
    draws = 4000 if isinstance(distribution, PoissonTrials) and distribution.mean > 50 else 20000
    counts: dict[int, int] = {}
    for _ in range(draws):
        k = sample_trial_count(distribution, rng=rng)
        assert isinstance(k, int)
        counts[k] = counts.get(k, 0) + 1
    if isinstance(distribution, TruncatedNegativeBinomial):
        assert min(counts) >= 1
    # Mean within 5 standard errors.
    mean = expected_trials(distribution)
    support = range(0, 4000)
    second_moment = math.fsum(k * k * trial_count_probability(distribution, k) for k in support)
    std_error = math.sqrt((second_moment - mean * mean) / draws)
    empirical = sum(k * c for k, c in counts.items()) / draws
    assert abs(empirical - mean) <= 5 * std_error
    # Chi-square over the cells with >= 20 expected draws, the rest lumped into one tail cell.
    cells, observed = [], []
    for k in support:
        expected = draws * trial_count_probability(distribution, k)
        if expected >= 20:
            cells.append(expected)
            observed.append(counts.pop(k, 0))
    cells.append(draws - math.fsum(cells))
    observed.append(sum(counts.values()))
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, cells, strict=True) if e > 0)
    assert statistic < stats.chi2.ppf(1 - 1e-6, df=len(cells) - 1)


def test_sampler_accepts_the_system_random_source() -> None:
    rng = secrets.SystemRandom()
    assert sample_trial_count(TruncatedNegativeBinomial(1.0, 0.5), rng=rng) >= 1
    assert sample_trial_count(TruncatedNegativeBinomial(-0.5, 0.5), rng=rng) >= 1
    assert sample_trial_count(PoissonTrials(2.0), rng=rng) >= 0


def test_sampler_is_reproducible_with_a_seed() -> None:
    distribution = TruncatedNegativeBinomial(0.5, 0.2)
    first = [sample_trial_count(distribution, rng=random.Random(7)) for _ in range(3)]
    assert first == [sample_trial_count(distribution, rng=random.Random(7)) for _ in range(3)]


# ----------------------------------------------------------------------------- exact check on a finite mechanism


@pytest.fixture(autouse=True)
def _fifty_digits() -> Iterator[None]:
    """The exact divergences below need more than double precision (and other modules' defaults stay)."""
    with mpmath.workdps(50):
        yield


Pmf = list[mpmath.mpf]


def _normalised(weights: Sequence[float]) -> Pmf:
    values = [mpmath.mpf(w) for w in weights]
    total = mpmath.fsum(values)
    return [v / total for v in values]


def _renyi(p: Pmf, q: Pmf, order: float) -> float:
    a = mpmath.mpf(order)
    return float(mpmath.log(mpmath.fsum(x**a * y ** (1 - a) for x, y in zip(p, q, strict=True))) / (a - 1))


def _exact_curve(p: Pmf, q: Pmf) -> list[float]:
    """RDP of the pair, both directions (the neighbouring relation is symmetric)."""
    return [max(_renyi(p, q, a), _renyi(q, p, a)) for a in ORDERS]


def _pgf(distribution: TrialDistribution) -> Callable[[mpmath.mpf], mpmath.mpf]:
    if isinstance(distribution, PoissonTrials):
        mu = mpmath.mpf(distribution.mean)
        return lambda x: mpmath.exp(mu * (x - 1))
    eta, gamma = mpmath.mpf(distribution.eta), mpmath.mpf(distribution.gamma)
    if distribution.eta == 0.0:
        return lambda x: mpmath.log(1 - (1 - gamma) * x) / mpmath.log(gamma)
    return lambda x: ((1 - (1 - gamma) * x) ** (-eta) - 1) / (gamma ** (-eta) - 1)


def _best_of_k(p: Pmf, distribution: TrialDistribution) -> Pmf:
    """Output pmf of 'K ~ distribution trials, release the largest output' (K hidden):
    P[best <= y] = E[F(y)^K] = PGF(F(y)); a Poisson K = 0 releases a fixed 'nothing'."""
    pgf = _pgf(distribution)
    out = [pgf(mpmath.mpf(0))] if isinstance(distribution, PoissonTrials) else []
    below = mpmath.mpf(0)
    for mass in p:
        out.append(pgf(below + mass) - pgf(below))
        below += mass
    return out


def _toy_pairs() -> list[tuple[Pmf, Pmf]]:
    """Neighbouring output distributions over ordered scores 0..m-1: randomized response, an
    exponential mechanism with a unit-sensitivity utility, and a lopsided pair."""
    e = math.exp(1.0)
    utility = [0.0, 1.0, 2.0, 3.0, 4.0]
    neighbour = [1.0, 1.0, 2.0, 2.0, 3.0]
    return [
        (_normalised([1.0, e]), _normalised([e, 1.0])),
        (_normalised([math.exp(0.6 * u) for u in utility]), _normalised([math.exp(0.6 * u) for u in neighbour])),
        (_normalised([0.96, 0.03, 0.01]), _normalised([0.9, 0.07, 0.03])),
    ]


@pytest.mark.parametrize("distribution", TNB_CASES[::2] + POISSON_CASES, ids=repr)
def test_bound_is_above_the_exact_divergence_of_the_best_trial(distribution: TrialDistribution) -> None:
    for p, q in _toy_pairs():
        trial = _exact_curve(p, q)
        bound = tuned_curve(distribution, trial)
        tuned_p, tuned_q = _best_of_k(p, distribution), _best_of_k(q, distribution)
        assert float(mpmath.fsum(tuned_p)) == pytest.approx(1.0, abs=1e-30)
        exact = _exact_curve(tuned_p, tuned_q)
        for a, value, truth in zip(ORDERS, bound, exact, strict=True):
            assert truth <= value, (a, truth, value)


def test_the_event_bound_covers_an_epsilon_dp_trial() -> None:
    """End to end: randomized response with eps = 1 is a PureDPEvent(1), whatever is tuned."""
    p, q = _toy_pairs()[0]
    for distribution in (TruncatedNegativeBinomial(0.5, 0.2), PoissonTrials(5.0)):
        bound = rdp_curve(_tuning(distribution, PureDPEvent(1.0, 1)))
        exact = _exact_curve(_best_of_k(p, distribution), _best_of_k(q, distribution))
        assert all(truth <= value for truth, value in zip(exact, bound, strict=True))


def test_bound_is_within_a_small_factor_of_the_truth_somewhere() -> None:
    """Not vacuous: for randomized response the bound is within 2.5x of the exact divergence at its
    best order (it is 1.1-2x in a random search over pairs)."""
    p, q = _toy_pairs()[0]
    for distribution in (TruncatedNegativeBinomial(1.0, 0.2), PoissonTrials(5.0)):
        bound = tuned_curve(distribution, _exact_curve(p, q))
        exact = _exact_curve(_best_of_k(p, distribution), _best_of_k(q, distribution))
        assert min(value / truth for value, truth in zip(bound, exact, strict=True)) < 2.5


def test_poisson_bound_fails_below_a_mean_of_one_so_it_is_refused() -> None:
    """Theorem 6's formula at mean 0.3 is below the exact divergence, even clamped at 0 (its
    log(mean) term is negative; a data-independent trial would get a negative cost): refused."""
    p, q = _toy_pairs()[2]
    mean = 0.3
    exact = _exact_curve(_best_of_k_poisson(p, mean), _best_of_k_poisson(q, mean))
    formula = [max(0.0, v) for v in _theorem_6(mean, _exact_curve(p, q))]
    assert any(truth > value for truth, value in zip(exact, formula, strict=True))
    with pytest.raises(PrivacyEventError):
        PoissonTrials(mean)


def _best_of_k_poisson(p: Pmf, mean: float) -> Pmf:
    """_best_of_k for a Poisson mean that PoissonTrials refuses."""
    mu = mpmath.mpf(mean)
    out = [mpmath.exp(-mu)]
    below = mpmath.mpf(0)
    for mass in p:
        out.append(mpmath.exp(mu * (below + mass - 1)) - mpmath.exp(mu * (below - 1)))
        below += mass
    return out


# ----------------------------------------------------------------------------- curve properties


CANDIDATES: list[PrivacyEvent] = [
    GaussianEvent(1.0, 1),
    PoissonSampledGaussianEvent(0.01, 1.1, 500),
    LaplaceEvent(2.0, 3),
    ComposedEvent((ZCDPEvent(0.1, 2), PureDPEvent(0.5, 1))),
]


@pytest.mark.parametrize("distribution", TNB_CASES[::3] + POISSON_CASES, ids=repr)
def test_tuned_curve_is_at_least_every_candidate_curve(distribution: TrialDistribution) -> None:
    event = HyperparameterTuningEvent(distribution, tuple(CANDIDATES))
    tuned = rdp_curve(event)
    for candidate in CANDIDATES:
        assert all(t >= c for t, c in zip(tuned, rdp_curve(candidate), strict=True))


def test_curve_depends_only_on_the_pointwise_maximum() -> None:
    distribution = TruncatedNegativeBinomial(0.5, 0.1)
    # Gaussian(1) dominates Gaussian(5) at every order: adding the cheaper one changes nothing.
    assert rdp_curve(_tuning(distribution, GaussianEvent(1.0, 1), GaussianEvent(5.0, 1))) == rdp_curve(
        _tuning(distribution, GaussianEvent(1.0, 1))
    )
    # Laplace and Gaussian curves cross: the tuned curve is that of their order-wise maximum.
    crossing = (GaussianEvent(1.2, 1), LaplaceEvent(1.0, 1))
    curves = [rdp_curve(c) for c in crossing]
    assert any(x < y for x, y in zip(*curves, strict=True)) and any(x > y for x, y in zip(*curves, strict=True))
    assert rdp_curve(_tuning(distribution, *crossing)) == tuned_curve(distribution, max_curves(curves))


def test_more_expected_trials_cost_more() -> None:
    previous = None
    for mean in (2.0, 10.0, 100.0):
        curve = rdp_curve(_tuning(truncated_negative_binomial_for_mean(mean, 1.0), GaussianEvent(2.0, 1)))
        if previous is not None:
            assert all(x > y for x, y in zip(curve, previous, strict=True))
        previous = curve


def test_free_candidates_still_cost_the_tuning_terms_and_never_nan() -> None:
    curve = rdp_curve(_tuning(TruncatedNegativeBinomial(1.0, 0.1), ComposedEvent(()), GaussianEvent(1.0, 0)))
    assert all(math.isfinite(v) and v > 0.0 for v in curve)


def test_tuning_composes_with_other_events() -> None:
    tuning = _tuning(PoissonTrials(4.0), GaussianEvent(3.0, 1))
    final = GaussianEvent(2.0, 1)
    composed = rdp_curve(ComposedEvent((tuning, final)))
    for total, x, y in zip(composed, rdp_curve(tuning), rdp_curve(final), strict=True):
        assert total >= x + y


def test_tuned_curve_validates_its_inputs() -> None:
    with pytest.raises(PrivacyEventError):
        tuned_curve(PoissonTrials(2.0), [1.0] * (len(ORDERS) - 1))
    with pytest.raises(PrivacyEventError):
        tuned_curve(PoissonTrials(2.0), [math.inf] * len(ORDERS))
    with pytest.raises(PrivacyEventError):
        tuned_curve("poisson", [1.0] * len(ORDERS))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- the event


@pytest.mark.parametrize(
    "build",
    [
        lambda: TruncatedNegativeBinomial(1.0, 0.0),
        lambda: TruncatedNegativeBinomial(1.0, 1.0),
        lambda: TruncatedNegativeBinomial(1.0, -0.1),
        lambda: TruncatedNegativeBinomial(1.0, math.nan),
        lambda: TruncatedNegativeBinomial(1.0, True),
        lambda: TruncatedNegativeBinomial(-1.0, 0.5),
        lambda: TruncatedNegativeBinomial(-2.0, 0.5),
        lambda: TruncatedNegativeBinomial(math.inf, 0.5),
        lambda: TruncatedNegativeBinomial("1", 0.5),  # type: ignore[arg-type]
        lambda: PoissonTrials(0.0),
        lambda: PoissonTrials(0.5),
        lambda: PoissonTrials(-1.0),
        lambda: PoissonTrials(math.inf),
        lambda: PoissonTrials(math.nan),
        lambda: _tuning(PoissonTrials(2.0)),
        lambda: HyperparameterTuningEvent(PoissonTrials(2.0), GaussianEvent(1.0, 1)),  # type: ignore[arg-type]
        lambda: HyperparameterTuningEvent(PoissonTrials(2.0), ("gaussian",)),  # type: ignore[arg-type]
        lambda: HyperparameterTuningEvent("poisson", (GaussianEvent(1.0, 1),)),  # type: ignore[arg-type]
        lambda: _tuning(PoissonTrials(2.0), _tuning(PoissonTrials(2.0), GaussianEvent(1.0, 1))),
        lambda: _tuning(
            PoissonTrials(2.0), ComposedEvent((GaussianEvent(1.0, 1), _tuning(PoissonTrials(2.0), GaussianEvent(1, 1))))
        ),
    ],
)
def test_constructors_reject_invalid_fields(build: Callable[[], object]) -> None:
    with pytest.raises(PrivacyEventError):
        build()


def test_fields_are_normalised_and_events_hash() -> None:
    event = HyperparameterTuningEvent(TruncatedNegativeBinomial(1, 0.5), [GaussianEvent(2, 1)])  # type: ignore[arg-type]
    assert event == _tuning(TruncatedNegativeBinomial(1.0, 0.5), GaussianEvent(2.0, 1))
    assert isinstance(event.candidates, tuple) and isinstance(event.distribution.eta, float)
    assert hash(event) == hash(_tuning(TruncatedNegativeBinomial(1.0, 0.5), GaussianEvent(2.0, 1)))
    assert isinstance(PoissonTrials(3).mean, float)


def test_tuning_has_no_leaves_to_sum() -> None:
    tuning = _tuning(PoissonTrials(2.0), GaussianEvent(1.0, 1), LaplaceEvent(1.0, 1))
    assert contains_tuning(tuning) and contains_tuning(ComposedEvent((GaussianEvent(1.0, 1), tuning)))
    assert not contains_tuning(ComposedEvent((GaussianEvent(1.0, 1),)))
    with pytest.raises(PrivacyEventError):
        list(iter_leaves(ComposedEvent((GaussianEvent(1.0, 1), tuning))))


distributions = st.one_of(
    st.builds(
        TruncatedNegativeBinomial,
        st.floats(min_value=-0.99, max_value=50.0),
        st.floats(min_value=1e-6, max_value=0.999999),
    ),
    st.builds(PoissonTrials, st.floats(min_value=1.0, max_value=1e3)),
)
leaves = st.one_of(
    st.builds(GaussianEvent, st.floats(min_value=0.1, max_value=100.0), st.integers(0, 1000)),
    st.builds(PureDPEvent, st.floats(min_value=0.01, max_value=10.0), st.integers(0, 10)),
)
candidate_lists = st.lists(
    st.one_of(leaves, st.lists(leaves, max_size=3).map(lambda xs: ComposedEvent(tuple(xs)))), min_size=1, max_size=4
)
tunings = st.builds(HyperparameterTuningEvent, distributions, candidate_lists.map(tuple))


@given(st.lists(st.one_of(tunings, leaves), max_size=3).map(lambda xs: ComposedEvent(tuple(xs))))
@settings(max_examples=100, deadline=None)
def test_json_round_trips_through_text(event: ComposedEvent) -> None:
    assert event_from_json(json.loads(json.dumps(event_to_json(event)))) == event


def test_json_layout_is_the_documented_one() -> None:
    event = _tuning(TruncatedNegativeBinomial(0.5, 0.25), GaussianEvent(2.0, 1))
    assert event_to_json(event)["event"] == {
        "kind": "hyperparameter_tuning",
        "distribution": {"kind": "truncated_negative_binomial", "eta": 0.5, "gamma": 0.25},
        "candidates": [{"kind": "gaussian", "noise_multiplier": 2.0, "count": 1}],
    }
    assert event_to_json(_tuning(PoissonTrials(5.0), GaussianEvent(2.0, 1)))["event"]["distribution"] == {
        "kind": "poisson",
        "mean": 5.0,
    }


def test_old_json_still_decodes() -> None:
    old = {
        "schema": "privtrain.privacy-event",
        "version": 1,
        "event": {"kind": "composed", "events": [{"kind": "gaussian", "noise_multiplier": 1.0, "count": 2}]},
    }
    assert event_from_json(old) == ComposedEvent((GaussianEvent(1.0, 2),))


_VALID = event_to_json(_tuning(TruncatedNegativeBinomial(1.0, 0.5), GaussianEvent(1.0, 1), PureDPEvent(0.5, 1)))


def _mutated(path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_VALID)
    node: Any = data
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "data",
    [
        _mutated(["event", "distribution", "gamma"], 1.5),
        _mutated(["event", "distribution", "gamma"], 0.0),
        _mutated(["event", "distribution", "gamma"], "0.5"),
        _mutated(["event", "distribution", "gamma"], True),
        _mutated(["event", "distribution", "eta"], -1.0),
        _mutated(["event", "distribution", "eta"], None),
        _mutated(["event", "distribution", "extra"], 1),
        _mutated(["event", "distribution", "kind"], "geometric"),
        _mutated(["event", "distribution", "kind"], "gaussian"),
        _mutated(["event", "distribution"], {"kind": "poisson", "mean": 0.5}),
        _mutated(["event", "distribution"], {"kind": "poisson", "mean": 2.0, "eta": 1.0}),
        _mutated(["event", "distribution"], [1.0, 0.5]),
        _mutated(["event", "distribution"], None),
        _mutated(["event", "candidates"], []),
        _mutated(["event", "candidates"], None),
        _mutated(["event", "candidates"], {"kind": "gaussian", "noise_multiplier": 1.0, "count": 1}),
        _mutated(["event", "candidates", 0, "count"], -1),
        _mutated(["event", "candidates", 0], copy.deepcopy(_VALID["event"])),
        _mutated(["event", "extra"], 1),
    ],
)
def test_malformed_json_is_rejected(data: Any) -> None:
    with pytest.raises(PrivacyEventError):
        event_from_json(data)


def test_depth_and_size_limits_cover_candidates() -> None:
    node: dict[str, Any] = {"kind": "gaussian", "noise_multiplier": 1.0, "count": 1}
    for _ in range(MAX_COMPOSITION_DEPTH + 1):
        node = {"kind": "composed", "events": [node]}
    deep = {"kind": "hyperparameter_tuning", "distribution": {"kind": "poisson", "mean": 2.0}, "candidates": [node]}
    with pytest.raises(PrivacyEventError, match="deeper"):
        event_from_json({"schema": "privtrain.privacy-event", "version": 1, "event": deep})
    leaf = {"kind": "gaussian", "noise_multiplier": 1.0, "count": 1}
    huge = {
        "kind": "hyperparameter_tuning",
        "distribution": {"kind": "poisson", "mean": 2.0},
        "candidates": [leaf] * 10_001,
    }
    with pytest.raises(PrivacyEventError, match="nodes"):
        event_from_json({"schema": "privtrain.privacy-event", "version": 1, "event": huge})


# ----------------------------------------------------------------------------- consumers


def test_prv_does_not_apply_to_tuning() -> None:
    tuning = _tuning(TruncatedNegativeBinomial(1.0, 0.1), GaussianEvent(2.0, 1))
    assert prv_epsilon(tuning, DELTA) is None
    assert prv_epsilon(ComposedEvent((tuning, GaussianEvent(2.0, 1))), DELTA) is None
    with pytest.raises(PrivacyEventError):
        pld_epsilon(tuning, DELTA)


@pytest.mark.parametrize("numeric", [False, True])
def test_single_job_falls_back_to_the_rdp_conversion(numeric: bool) -> None:
    tuning = _tuning(TruncatedNegativeBinomial(1.0, 0.1), GaussianEvent(2.0, 1), LaplaceEvent(3.0, 1))
    for event in (tuning, ComposedEvent((tuning, GaussianEvent(5.0, 1)))):
        curve = rdp_curve(event)
        result = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=numeric)
        assert result.method == "rdp-single-job"
        assert result.epsilon == epsilon_from_rdp(curve, DELTA)[0]
        assert result.epsilon <= ledger_epsilon(curve, DELTA)
        assert rdp_single_job_epsilon(event, DELTA) == result.epsilon


def test_capped_single_job_needs_no_child_process_for_tuning() -> None:
    event = _tuning(PoissonTrials(10.0), GaussianEvent(2.0, 1))
    result = capped_single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, timeout_s=0.0)
    assert result == single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=False)
    assert "not available" not in result.detail
