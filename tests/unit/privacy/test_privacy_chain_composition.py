"""The composed guarantee of several jobs on the same rows (kernel/privacy/chain_composition.py):
golden values against closed forms, and the properties a composition must have."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.privacy import (
    GaussianEvent,
    PoissonSampledGaussianEvent,
    PureDPEvent,
    add_curves,
    compose_guarantee,
    epsilon_from_rdp,
    ledger_epsilon,
    rdp_curve,
    single_job_epsilon,
    summed_curve,
)
from kernel.privacy.single_job import gaussian_dp_epsilon


def test_two_gaussians_compose_to_the_gaussian_of_their_combined_mu() -> None:
    """Gaussians of σ1 and σ2 compose to μ-GDP with μ² = 1/σ1² + 1/σ2²: the exact profile."""
    first, second = GaussianEvent(noise_multiplier=2.0, count=3), GaussianEvent(noise_multiplier=3.0, count=5)
    composed = compose_guarantee([first, second], 1e-5, zcdp_is_gaussian=False, numeric=False)
    mu = math.sqrt(3 / 4.0 + 5 / 9.0)
    assert composed.tight.method == "gaussian-dp"
    assert composed.tight.epsilon == pytest.approx(gaussian_dp_epsilon(mu=mu, delta=1e-5), rel=1e-6)
    curve = add_curves(rdp_curve(first), rdp_curve(second))
    assert composed.curve == curve and composed.events == 2
    assert composed.ledger_epsilon == ledger_epsilon(curve, 1e-5)
    assert (composed.rdp_epsilon, composed.rdp_order) == epsilon_from_rdp(curve, 1e-5)


def test_one_event_is_that_jobs_own_guarantee() -> None:
    event = PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=1.1, count=500)
    alone = compose_guarantee([event], 1e-5, zcdp_is_gaussian=False, numeric=False)
    assert alone.ledger_epsilon == ledger_epsilon(rdp_curve(event), 1e-5)
    assert alone.tight == single_job_epsilon(event, 1e-5, zcdp_is_gaussian=False, numeric=False)


@settings(max_examples=25, deadline=None)
@given(
    sigmas=st.lists(st.floats(min_value=0.8, max_value=6.0), min_size=2, max_size=4),
    q=st.floats(min_value=0.001, max_value=0.2),
    steps=st.integers(min_value=1, max_value=300),
    delta=st.sampled_from([1e-5, 1e-6, 1e-8]),
)
def test_composing_never_claims_less_than_any_part(sigmas: list[float], q: float, steps: int, delta: float) -> None:
    """Adding a job's release can only weaken the guarantee: the composition's ε is at least each
    part's, in ledger terms and tight, and the tight bound never exceeds the ledger-terms one."""
    events = [PoissonSampledGaussianEvent(sampling_probability=q, noise_multiplier=s, count=steps) for s in sigmas]
    composed = compose_guarantee(events, delta, zcdp_is_gaussian=False, numeric=False)
    assert composed.curve == summed_curve(events)
    for event in events:
        alone = compose_guarantee([event], delta, zcdp_is_gaussian=False, numeric=False)
        assert composed.ledger_epsilon >= alone.ledger_epsilon
        assert composed.rdp_epsilon >= alone.rdp_epsilon
    assert composed.tight.epsilon <= composed.ledger_epsilon


def test_pure_dp_jobs_compose_to_at_most_the_sum_of_their_epsilons() -> None:
    parts = [PureDPEvent(epsilon=0.5, count=1), PureDPEvent(epsilon=0.5, count=2)]
    composed = compose_guarantee(parts, 1e-6, zcdp_is_gaussian=False, numeric=False)
    assert composed.tight.epsilon <= 1.5 + 1e-12
    assert composed.tight.epsilon > 0.5


def test_numeric_composition_runs_the_capped_accountant() -> None:
    """The worker's path (numeric accountants in the capped child) is at most the closed forms'."""
    events = [PoissonSampledGaussianEvent(sampling_probability=0.05, noise_multiplier=1.2, count=40)] * 2
    closed = compose_guarantee(events, 1e-5, zcdp_is_gaussian=False, numeric=False)
    numeric = compose_guarantee(events, 1e-5, zcdp_is_gaussian=False, numeric=True)
    assert numeric.tight.epsilon <= closed.tight.epsilon + 1e-12
    assert numeric.ledger_epsilon == closed.ledger_epsilon
