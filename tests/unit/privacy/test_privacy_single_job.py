"""The report's single-job ε: golden values, an independent accountant, and validity properties."""

from __future__ import annotations

import itertools
import logging
import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from algorithms.registry import ALGORITHMS, InvalidHyperparameters
from kernel.datasets.facts import DatasetFacts
from kernel.privacy import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    SingleJobEpsilon,
    ZCDPEvent,
    ledger_epsilon,
    rdp_curve,
    single_job_epsilon,
)
from kernel.privacy.accounting import PldAccountant, PrvAccountant, RdpAtDeltaAccountant
from kernel.privacy.prv import EPS_ERROR
from kernel.privacy.single_job import (
    METHODS,
    gaussian_dp_delta,
    gaussian_dp_epsilon,
    pld_epsilon,
    pure_dp_composition_epsilon,
    pure_dp_composition_log_delta,
)
from kernel.schemas.jobs import TrainingSpec

DELTA = 1e-5
logging.getLogger().setLevel(logging.ERROR)  # dp-accounting warns when asked for optimistic PLDs


def _ledger(event: PrivacyEvent, delta: float = DELTA) -> float:
    return ledger_epsilon(rdp_curve(event), delta)


def _dp_accounting_gaussian(sigma: float, count: int, *, q: float = 1.0, pessimistic: bool) -> float:
    """dp-accounting's PLD ε (independent accountant); optimistic = a lower estimate of the truth."""
    pld = pld_module.from_gaussian_mechanism(
        sigma,
        sampling_prob=q,
        pessimistic_estimate=pessimistic,
        use_connect_dots=pessimistic,
        value_discretization_interval=1e-4,
    )
    return pld.self_compose(count).get_epsilon_for_delta(DELTA)


# ----------------------------------------------------------------------------- golden values


def test_gaussian_dp_profile_at_mu_one_both_directions() -> None:
    direct = norm.cdf(-0.5) - math.e * norm.cdf(-1.5)  # Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)
    assert gaussian_dp_delta(mu=1.0, epsilon=1.0) == pytest.approx(direct, rel=1e-12)
    assert gaussian_dp_delta(mu=1.0, epsilon=1.0) == pytest.approx(0.1269, abs=5e-5)
    eps = gaussian_dp_epsilon(mu=1.0, delta=direct)
    assert 1.0 <= eps <= 1.0 + 1e-5  # never below the root; the margin is tiny


def test_gaussian_dp_far_tail_is_finite_and_monotone() -> None:
    values = [gaussian_dp_epsilon(mu=0.3, delta=d) for d in (1e-3, 1e-6, 1e-12, 1e-30)]
    assert all(math.isfinite(v) for v in values) and values == sorted(values)


def test_zcdp_declared_gaussian_equals_the_gaussian_event() -> None:
    rho = 0.02
    zcdp = single_job_epsilon(ZCDPEvent(rho=rho, count=30), DELTA, zcdp_is_gaussian=True, numeric=True)
    gaussian = single_job_epsilon(
        GaussianEvent(1.0 / math.sqrt(2.0 * rho), 30), DELTA, zcdp_is_gaussian=False, numeric=True
    )
    assert zcdp.method == gaussian.method == "gaussian-dp"
    assert zcdp.epsilon == pytest.approx(gaussian.epsilon, rel=1e-12)
    assert zcdp.epsilon == pytest.approx(gaussian_dp_epsilon(mu=math.sqrt(2 * rho * 30), delta=DELTA), rel=1e-12)


def test_zcdp_not_declared_gaussian_uses_the_zcdp_conversion_and_is_larger() -> None:
    event = ZCDPEvent(rho=0.02, count=30)
    arbitrary = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=True)
    gaussian = single_job_epsilon(event, DELTA, zcdp_is_gaussian=True, numeric=True)
    assert arbitrary.method == "rdp-single-job" and gaussian.epsilon < arbitrary.epsilon < _ledger(event)
    rho = 0.6  # the continuous optimum of CKS's conversion at δ, by a dense independent scan
    scan = min(
        rho * a + math.log1p(-1 / a) - (math.log(DELTA) + math.log(a)) / (a - 1)
        for a in (1 + i / 1000 for i in range(1, 200_000))
    )
    assert scan - 1e-7 <= arbitrary.epsilon <= scan + 1e-6


def test_pure_dp_composition_of_one_is_epsilon0_in_the_delta_to_zero_limit() -> None:
    eps0 = 0.7
    eps = pure_dp_composition_epsilon(epsilon0=eps0, count=1, delta=1e-12)
    exact = math.log(math.exp(eps0) - 1e-12 * (1 + math.exp(eps0)))  # δ = (e^ε0 − e^ε)/(1 + e^ε0)
    assert exact <= eps <= eps0 and eps == pytest.approx(eps0, abs=1e-9)


def _enumerated_delta(eps0: float, k: int, eps: float) -> float:
    """Σ over all 2^k outcomes of k-fold randomized response of [P(o) − e^ε Q(o)]_+."""
    p_keep = math.exp(eps0) / (1 + math.exp(eps0))
    total = 0.0
    for outcome in itertools.product((0, 1), repeat=k):
        flips = sum(outcome)
        p = p_keep ** (k - flips) * (1 - p_keep) ** flips
        q = p_keep**flips * (1 - p_keep) ** (k - flips)
        total += max(0.0, p - math.exp(eps) * q)
    return total


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.2, 0.4, 0.61, 0.8])
def test_pure_dp_composition_matches_direct_enumeration(eps: float) -> None:
    expected = _enumerated_delta(0.1, 10, eps)
    assert math.exp(pure_dp_composition_log_delta(epsilon0=0.1, count=10, epsilon=eps)) == pytest.approx(
        expected, rel=1e-9
    )


def test_pure_dp_composition_inverse_is_valid_and_tight() -> None:
    eps = pure_dp_composition_epsilon(epsilon0=0.1, count=10, delta=1e-3)
    assert _enumerated_delta(0.1, 10, eps) <= 1e-3
    assert _enumerated_delta(0.1, 10, eps - 1e-4) > 1e-3 or eps < 1e-4


def test_exponential_mechanism_gets_a_bound_below_the_ledger() -> None:
    for event in (
        ExponentialMechanismEvent(0.1, 100),
        ExponentialMechanismEvent(2.0, 3),
        ExponentialMechanismEvent(0.01, 100_000),
    ):
        result = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=True)
        assert result.method in ("pure-dp-optimal", "rdp-single-job") and result.epsilon < _ledger(event)
        # never below the exact optimum of k ε0-DP composition when that is what won
        if result.method == "pure-dp-optimal":
            assert result.epsilon == pure_dp_composition_epsilon(epsilon0=event.epsilon, count=event.count, delta=DELTA)


# ----------------------------------------------------------------------------- independent accountant


@pytest.mark.parametrize("sigma, count", [(1.0, 1), (2.0, 50), (5.0, 1000)])
def test_gaussian_against_dp_accounting_pld(sigma: float, count: int) -> None:
    ours = single_job_epsilon(GaussianEvent(sigma, count), DELTA, zcdp_is_gaussian=False, numeric=True)
    assert ours.method == "gaussian-dp"
    pessimistic = _dp_accounting_gaussian(sigma, count, pessimistic=True)
    optimistic = _dp_accounting_gaussian(sigma, count, pessimistic=False)
    # exact profile: at or above the truth by the root margin (≤ 1e-6), below any pessimistic PLD
    assert optimistic - 1e-9 <= ours.epsilon <= pessimistic + 1e-6
    assert ours.epsilon == pytest.approx(pessimistic, abs=5e-3)


@pytest.mark.parametrize("q, sigma, count", [(0.01, 1.0, 1000), (0.2, 5.0, 100), (0.05, 2.0, 300)])
def test_subsampled_gaussian_against_dp_accounting_pld(q: float, sigma: float, count: int) -> None:
    ours = single_job_epsilon(PoissonSampledGaussianEvent(q, sigma, count), DELTA, zcdp_is_gaussian=False, numeric=True)
    assert ours.method in ("prv", "pld")
    optimistic = _dp_accounting_gaussian(sigma, count, q=q, pessimistic=False)
    pessimistic = _dp_accounting_gaussian(sigma, count, q=q, pessimistic=True)
    assert optimistic - 1e-9 <= ours.epsilon <= pessimistic + 0.03


def test_prv_failure_case_now_has_a_number() -> None:
    """q = 0.1, σ = 0.6, T = 50: prv-accountant fails; the PLD fallback answers."""
    event = PoissonSampledGaussianEvent(0.1, 0.6, 50)
    result = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=True)
    assert isinstance(result, SingleJobEpsilon) and result.method == "pld"
    assert result.epsilon <= _ledger(event)
    optimistic = _dp_accounting_gaussian(0.6, 50, q=0.1, pessimistic=False)
    assert result.epsilon >= optimistic - 1e-9
    assert result.epsilon == pytest.approx(pld_epsilon(event, DELTA))


def test_mixed_zcdp_and_laplace_uses_a_numeric_accountant_only_when_gaussian() -> None:
    event = ComposedEvent((ZCDPEvent(0.05, 40), LaplaceEvent(10.0, 1)))
    gaussian = single_job_epsilon(event, DELTA, zcdp_is_gaussian=True, numeric=True)
    arbitrary = single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=True)
    assert gaussian.method in ("prv", "pld") and arbitrary.method == "rdp-single-job"
    assert gaussian.epsilon < arbitrary.epsilon <= _ledger(event)


def test_failing_methods_are_skipped_never_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel.privacy import single_job

    single_job.single_job_epsilon.cache_clear()
    monkeypatch.setattr(PrvAccountant, "epsilon", lambda *_: float("nan"))
    monkeypatch.setattr(PldAccountant, "epsilon", lambda *_: -1.0)
    monkeypatch.setattr(RdpAtDeltaAccountant, "epsilon", lambda *_: 1 / 0)
    event = PoissonSampledGaussianEvent(0.01, 1.0, 100)
    result = single_job.single_job_epsilon(event, DELTA, zcdp_is_gaussian=False, numeric=True)
    single_job.single_job_epsilon.cache_clear()
    assert result.method == "rdp" and result.epsilon == _ledger(event)


# ----------------------------------------------------------------------------- properties


_COUNTS = st.integers(min_value=0, max_value=300)
_LEAVES = st.one_of(
    st.builds(PoissonSampledGaussianEvent, st.floats(1e-3, 1.0), st.floats(0.5, 20.0), _COUNTS),
    st.builds(GaussianEvent, st.floats(0.3, 50.0), _COUNTS),
    st.builds(LaplaceEvent, st.floats(0.5, 100.0), _COUNTS),
    st.builds(ZCDPEvent, st.floats(1e-5, 0.5), _COUNTS),
    st.builds(PureDPEvent, st.floats(1e-3, 2.0), _COUNTS),
    st.builds(ExponentialMechanismEvent, st.floats(1e-3, 2.0), _COUNTS),
)
_EVENTS = st.one_of(_LEAVES, st.lists(_LEAVES, min_size=1, max_size=3).map(lambda xs: ComposedEvent(tuple(xs))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=_EVENTS, delta=st.sampled_from([1e-9, 1e-6, 1e-5, 1e-3]), gaussian=st.booleans())
def test_every_event_gets_a_valid_bound_never_above_the_ledger(
    event: PrivacyEvent, delta: float, gaussian: bool
) -> None:
    result = single_job_epsilon(event, delta, zcdp_is_gaussian=gaussian, numeric=True)
    assert result.method in METHODS and result.detail
    assert math.isfinite(result.epsilon) and 0.0 <= result.epsilon <= _ledger(event, delta)
    looser = single_job_epsilon(event, delta * 10, zcdp_is_gaussian=gaussian, numeric=True)
    # Exact and closed-form bounds are monotone in δ; prv-accountant's and the PLD's upper bounds
    # are each valid but carry a discretisation error up to EPS_ERROR, so two of them may cross.
    numeric = {result.method, looser.method} & {"prv", "pld"}
    assert looser.epsilon <= result.epsilon + (EPS_ERROR if numeric else 0.0)


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.2, 100.0), count=st.integers(1, 10_000), delta=st.floats(1e-12, 0.5))
def test_gaussian_dp_epsilon_meets_delta(sigma: float, count: int, delta: float) -> None:
    mu = math.sqrt(count) / sigma
    eps = gaussian_dp_epsilon(mu=mu, delta=delta)
    assert gaussian_dp_delta(mu=mu, epsilon=eps) <= delta
    if eps > 1e-6:
        assert gaussian_dp_delta(mu=mu, epsilon=eps * (1 - 1e-4)) > delta * (1 - 1e-5)


@settings(max_examples=30, deadline=None)
@given(eps0=st.floats(1e-3, 1.0), count=st.integers(1, 2000), delta=st.floats(1e-10, 0.1))
def test_pure_dp_composition_is_below_basic_and_at_least_one_step(eps0: float, count: int, delta: float) -> None:
    eps = pure_dp_composition_epsilon(epsilon0=eps0, count=count, delta=delta)
    assert eps <= eps0 * count * (1 + 1e-12)
    assert math.exp(pure_dp_composition_log_delta(epsilon0=eps0, count=count, epsilon=eps)) <= delta


# ----------------------------------------------------------------------------- the catalogue


def _catalogue_events() -> dict[str, PrivacyEvent]:
    """Every registered algorithm's event at σ = 2 (default hyperparameters), on a dataset shape
    and a training spec it accepts; the Laplace and Gaussian evaluation releases composed on."""
    facts = DatasetFacts(n_rows=1000, feature_shape=(20,), task="regression", n_classes=None)
    events: dict[str, PrivacyEvent] = {}
    for name in ALGORITHMS:
        definition = ALGORITHMS.get(name)
        for batch in (1000, 100):
            try:
                hyperparameters = definition.adopt_privacy_target(definition.Hyperparameters(), target_epsilon=2.0)
                plan = definition.plan(
                    hyperparameters, TrainingSpec(steps=20, batch_size=batch, learning_rate=0.1), facts
                )
                events[name] = plan.event(2.0)
                break
            except (InvalidHyperparameters, ValueError, TypeError):
                continue
    return events


def test_every_catalogue_event_gets_a_number() -> None:
    events = _catalogue_events()
    assert set(events) == set(ALGORITHMS), sorted(set(ALGORITHMS) - set(events))
    kinds = set()
    for name, training in events.items():
        gaussian = ALGORITHMS.get(name).zcdp_leaves_are_gaussian
        for event in (
            training,
            ComposedEvent((training, LaplaceEvent(20.0, 1))),
            ComposedEvent((training, GaussianEvent(20.0, 1))),
        ):
            result = single_job_epsilon(event, DELTA, zcdp_is_gaussian=gaussian, numeric=True)
            assert result.method in METHODS and 0.0 <= result.epsilon <= _ledger(event), name
            kinds.update(type(leaf).__name__ for leaf in _leaves(event))
    assert {"ZCDPEvent", "ExponentialMechanismEvent", "PureDPEvent", "LaplaceEvent"} <= kinds


def test_kl_family_declares_gaussian_zcdp_and_nothing_else_does() -> None:
    declared = {name for name in ALGORITHMS if ALGORITHMS.get(name).zcdp_leaves_are_gaussian}
    assert declared == {"kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point"}


def _leaves(event: PrivacyEvent) -> list[PrivacyEvent]:
    if isinstance(event, ComposedEvent):
        return [leaf for child in event.events for leaf in _leaves(child)]
    return [event]


def test_an_event_with_no_uses_is_free() -> None:
    empty = ComposedEvent((GaussianEvent(1.0, 0), PureDPEvent(1.0, 0)))
    assert single_job_epsilon(empty, DELTA, zcdp_is_gaussian=False, numeric=True).epsilon == 0.0


def test_pure_dp_composition_matches_the_known_exact_value() -> None:
    """k = 300, ε0 = 1, δ = 1e-5: 199.955 (the exact value test_privacy_prv anchors PRV to)."""
    assert pure_dp_composition_epsilon(epsilon0=1.0, count=300, delta=1e-5) == pytest.approx(199.955, abs=1e-3)
