"""Noise calibration against the ledger's own filter, and what that means for a dataset budget."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from kernel.privacy import (
    ORDERS,
    CalibrationError,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    add_curves,
    admission_order,
    calibrate_noise_multiplier,
    capacity_curve,
    ledger_epsilon,
    rdp_curve,
)

ZEROS = (0.0,) * len(ORDERS)
MNIST_Q = 256 / 60000


def mnist_steps(epochs: int) -> int:
    """Poisson-sampled epochs counted as ceil(epochs / q) steps: 3 epochs of MNIST at B = 256 -> 704."""
    return math.ceil(epochs / MNIST_Q)


def subsampled(q: float, steps: int) -> Callable[[float], PrivacyEvent]:
    return lambda sigma: PoissonSampledGaussianEvent(q, sigma, steps)


def admitted_alone(event: PrivacyEvent, *, epsilon: float, delta: float) -> bool:
    capacity = capacity_curve(epsilon, delta)
    return admission_order(committed=ZEROS, reserved=ZEROS, cost=rdp_curve(event), capacity=capacity) is not None


def jobs_that_fit(
    job_target: float,
    *,
    budget_epsilon: float = 8.0,
    delta: float = 1e-5,
    sampling_probability: float = MNIST_Q,
    epochs: int = 3,
) -> int:
    """How many identical jobs, each calibrated to ``job_target``, a fresh dataset admits."""
    build = subsampled(sampling_probability, math.ceil(epochs / sampling_probability))
    sigma = calibrate_noise_multiplier(build, target_epsilon=job_target, delta=delta)
    cost = rdp_curve(build(sigma))
    capacity = capacity_curve(budget_epsilon, delta)
    used, admitted = ZEROS, 0
    while admission_order(committed=used, reserved=ZEROS, cost=cost, capacity=capacity) is not None:
        used = add_curves(used, cost)
        admitted += 1
    return admitted


CASES = [
    (subsampled(0.01, 1000), 2.0, 1e-5),
    (subsampled(0.1, 100), 1.0, 1e-6),
    (subsampled(1.0, 10), 3.0, 1e-5),
    (subsampled(MNIST_Q, mnist_steps(3)), 8.0, 1e-5),
    (subsampled(0.02, 5000), 0.5, 1e-5),
    (lambda b: LaplaceEvent(b, 10), 1.0, 1e-5),
    (lambda s: GaussianEvent(s, 1), 0.2, 1e-9),
]


@pytest.mark.parametrize(("build", "target", "delta"), CASES)
def test_calibrated_sigma_is_the_admission_boundary(
    build: Callable[[float], PrivacyEvent], target: float, delta: float
) -> None:
    sigma = calibrate_noise_multiplier(build, target_epsilon=target, delta=delta)
    assert admitted_alone(build(sigma), epsilon=target, delta=delta)
    assert not admitted_alone(build(sigma * (1 - 1e-4)), epsilon=target, delta=delta)
    assert admitted_alone(build(sigma * (1 + 1e-4)), epsilon=target, delta=delta)
    spent = ledger_epsilon(rdp_curve(build(sigma)), delta)
    assert target * (1 - 1e-3) <= spent <= target * (1 + 1e-10)


def test_bracket_is_widened_when_the_guess_is_wrong() -> None:
    build = subsampled(0.01, 1000)
    reference = calibrate_noise_multiplier(build, target_epsilon=2.0, delta=1e-5)
    narrow_low = calibrate_noise_multiplier(build, target_epsilon=2.0, delta=1e-5, lower=0.05, upper=0.1)
    narrow_high = calibrate_noise_multiplier(build, target_epsilon=2.0, delta=1e-5, lower=10.0, upper=20.0)
    assert narrow_low == pytest.approx(reference, rel=2e-6)
    assert narrow_high == pytest.approx(reference, rel=2e-6)


@pytest.mark.parametrize("build", [subsampled(MNIST_Q, mnist_steps(3)), lambda s: GaussianEvent(s, 1)])
def test_a_budget_of_8_admits_one_job_of_8_and_then_nothing(build: Callable[[float], PrivacyEvent]) -> None:
    capacity = capacity_curve(8.0, 1e-5)
    cost = rdp_curve(build(calibrate_noise_multiplier(build, target_epsilon=8.0, delta=1e-5)))
    assert admission_order(committed=ZEROS, reserved=ZEROS, cost=cost, capacity=capacity) is not None
    assert admission_order(committed=ZEROS, reserved=cost, cost=cost, capacity=capacity) is None
    assert admission_order(committed=cost, reserved=ZEROS, cost=cost, capacity=capacity) is None


@pytest.mark.parametrize("build", [subsampled(MNIST_Q, mnist_steps(3)), lambda s: GaussianEvent(s, 1)])
def test_a_budget_of_8_admits_two_jobs_of_4_with_room(build: Callable[[float], PrivacyEvent]) -> None:
    capacity = capacity_curve(8.0, 1e-5)
    cost = rdp_curve(build(calibrate_noise_multiplier(build, target_epsilon=4.0, delta=1e-5)))
    assert admission_order(committed=ZEROS, reserved=ZEROS, cost=cost, capacity=capacity) is not None
    assert admission_order(committed=cost, reserved=ZEROS, cost=cost, capacity=capacity) is not None
    two = add_curves(cost, cost)
    assert ledger_epsilon(two, 1e-5) < 8.0  # RDP composition is sublinear: room is left


def test_how_many_mnist_jobs_fit_into_a_budget_of_8() -> None:
    """MNIST-like setting: q = 256/60000, 3 epochs (704 Poisson steps), delta = 1e-5, eps_G = 8.
    Jobs calibrated to target 1, 2, 4, 8 (each alone spends exactly its target in ledger terms)."""
    assert {target: jobs_that_fit(target) for target in (1.0, 2.0, 4.0, 8.0)} == {1.0: 157, 2.0: 52, 4.0: 14, 8.0: 1}


@pytest.mark.parametrize(
    ("target", "delta", "lower", "upper"),
    [
        (1e-9, 1e-5, 0.05, 50.0),  # capacity is zero at every order: nothing can ever be admitted
        (0.0, 1e-5, 0.05, 50.0),
        (-1.0, 1e-5, 0.05, 50.0),
        (math.nan, 1e-5, 0.05, 50.0),
        (math.inf, 1e-5, 0.05, 50.0),
        (1.0, 0.0, 0.05, 50.0),
        (1.0, 1.0, 0.05, 50.0),
        (1.0, 1e-5, 5.0, 1.0),
        (1.0, 1e-5, -1.0, 1.0),
        (1.0, 1e-5, 0.05, math.inf),
        (1e9, 1e-5, 0.05, 50.0),  # so loose that even sigma = 1e-4 is admitted
    ],
)
def test_impossible_or_invalid_requests_raise(target: float, delta: float, lower: float, upper: float) -> None:
    with pytest.raises(CalibrationError):
        calibrate_noise_multiplier(
            lambda s: GaussianEvent(s, 1), target_epsilon=target, delta=delta, lower=lower, upper=upper
        )


def test_a_builder_that_makes_invalid_events_raises_calibration_error() -> None:
    with pytest.raises(CalibrationError):
        calibrate_noise_multiplier(lambda s: PoissonSampledGaussianEvent(1.5, s, 10), target_epsilon=1.0, delta=1e-5)


def test_calibration_error_is_a_value_error() -> None:
    assert issubclass(CalibrationError, ValueError)
