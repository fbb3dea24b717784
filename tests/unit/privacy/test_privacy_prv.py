"""prv-accountant's tight single-job epsilon: anchors, closed forms, and refusal to guess."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from prv_accountant import PureDPMechanism
from scipy import integrate, optimize, stats

from kernel.privacy import (
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEvent,
    PrivacyEventError,
    PureDPEvent,
    ZCDPEvent,
    epsilon_from_rdp,
    prv_epsilon,
    rdp_curve,
)
from kernel.privacy import prv as prv_module

DELTA = 1e-5
SUBSAMPLED_ANCHORS = {(0.01, 1.0, 1000): 1.8282, (0.1, 2.0, 100): 2.3374, (0.02, 1.1, 5000): 7.8609}


def _rdp_epsilon(event: PrivacyEvent, delta: float = DELTA) -> float:
    return epsilon_from_rdp(rdp_curve(event), delta)[0]


def _solve(delta_of_eps: Callable[[float], float], *, delta: float, hi: float) -> float:
    return float(optimize.brentq(lambda e: delta_of_eps(e) - delta, 0.0, hi, xtol=1e-12))


def test_gaussian_anchor_mu_1() -> None:
    exact = _solve(lambda e: stats.norm.cdf(-e + 0.5) - math.exp(e) * stats.norm.cdf(-e - 0.5), delta=DELTA, hi=50.0)
    assert exact == pytest.approx(4.3772, abs=1e-4)
    for event in (PoissonSampledGaussianEvent(1.0, 10.0, 100), GaussianEvent(10.0, 100)):
        eps = prv_epsilon(event, DELTA)
        assert eps is not None
        assert exact - 1e-3 <= eps <= exact + 0.02
        assert eps <= _rdp_epsilon(event)


@pytest.mark.parametrize(("params", "eps_pld"), SUBSAMPLED_ANCHORS.items())
def test_subsampled_anchors(params: tuple[float, float, int], eps_pld: float) -> None:
    event = PoissonSampledGaussianEvent(*params)
    eps = prv_epsilon(event, DELTA)
    assert eps is not None
    assert eps == pytest.approx(eps_pld, rel=0.02)
    assert eps <= _rdp_epsilon(event)


def _laplace_delta(b: float, eps: float) -> float:
    """delta(eps) = int (p - e^eps q)_+ for p = Lap(0, b), q = Lap(1, b), by quadrature."""

    def integrand(x: float) -> float:
        p = math.exp(-abs(x) / b) / (2 * b)
        q = math.exp(-abs(x - 1) / b) / (2 * b)
        return max(0.0, p - math.exp(eps) * q)

    return sum(
        integrate.quad(integrand, lo, hi, epsabs=1e-14, limit=200)[0]
        for lo, hi in ((-np.inf, 0.0), (0.0, 1.0), (1.0, np.inf))
    )


@pytest.mark.parametrize("b", [2.0, 0.5])
def test_laplace_single_use_matches_quadrature(b: float) -> None:
    # prv-accountant's LaplaceMechanism(mu) takes mu = 1/b; passing b would be off by a factor b^2.
    delta = 1e-3
    exact = _solve(lambda e: _laplace_delta(b, e), delta=delta, hi=1.0 / b)
    eps = prv_epsilon(LaplaceEvent(b, 1), delta)
    assert eps is not None
    assert exact - 1e-3 <= eps <= exact + 0.03
    assert eps <= 1.0 / b + 0.02


def _randomized_response_composition_delta(eps0: float, *, k: int, eps: float) -> float:
    """Exact delta(eps) of k-fold eps0-randomized response: loss eps0 (2X - k), X ~ Bin(k, p)."""
    p = math.exp(eps0) / (1 + math.exp(eps0))
    i = np.arange(k + 1)
    loss = eps0 * (2 * i - k)
    return float(np.sum(stats.binom.pmf(i, k, p) * np.clip(1 - np.exp(eps - loss), 0, None)))


@pytest.mark.parametrize(("eps0", "k"), [(1.0, 1), (0.1, 50), (1.0, 300)])
def test_pure_dp_matches_randomized_response(eps0: float, k: int) -> None:
    """(1.0, 300): exact 199.955; prv-accountant with its own PureDPMechanism answers ~134 (its
    domain, sized from the too-small rdp(), cuts off the composed mass), ours ~199.97."""
    exact = _solve(lambda e: _randomized_response_composition_delta(eps0, k=k, eps=e), delta=DELTA, hi=eps0 * k)
    eps = prv_epsilon(PureDPEvent(eps0, k), DELTA)
    assert eps is not None
    assert exact - 1e-3 <= eps <= exact + 0.03


def test_prv_accountant_pure_dp_rdp_is_too_small_and_ours_is_not() -> None:
    """Why prv.py subclasses PureDPMechanism: its rdp() is (a-1)eps/a, below the true RDP of
    randomized response, and PRVAccountant sizes its domain from rdp()."""
    eps, a = 1.0, 2.0
    p = math.exp(eps) / (1 + math.exp(eps))
    true_rdp = math.log(p**a * (1 - p) ** (1 - a) + (1 - p) ** a * p ** (1 - a)) / (a - 1)
    assert PureDPMechanism(eps=eps).rdp(a) < true_rdp
    assert prv_module._PureDPWithSoundRdp(eps=eps).rdp(a) >= true_rdp


def test_heterogeneous_composition() -> None:
    parts = (PoissonSampledGaussianEvent(0.01, 1.0, 1000), GaussianEvent(10.0, 100), LaplaceEvent(20.0, 5))
    event = ComposedEvent((parts[0], ComposedEvent(parts[1:])))
    eps = prv_epsilon(event, DELTA)
    assert eps is not None
    assert eps <= _rdp_epsilon(event)
    singles = [prv_epsilon(part, DELTA) for part in parts[:2]]
    assert all(s is not None and eps > s for s in singles)


def test_identical_leaves_are_merged_into_one_self_composition() -> None:
    split = ComposedEvent((GaussianEvent(10.0, 40), GaussianEvent(10.0, 60)))
    assert prv_epsilon(split, DELTA) == pytest.approx(prv_epsilon(GaussianEvent(10.0, 100), DELTA), abs=1e-9)


@pytest.mark.parametrize(
    "event",
    [
        ZCDPEvent(0.1, 1),
        ExponentialMechanismEvent(1.0, 1),
        ComposedEvent((GaussianEvent(1.0, 1), ComposedEvent((ZCDPEvent(0.1, 0),)))),
    ],
)
def test_mechanisms_without_a_prv_give_none(event: PrivacyEvent) -> None:
    assert prv_epsilon(event, DELTA) is None


def test_nothing_costs_nothing() -> None:
    assert prv_epsilon(GaussianEvent(1.0, 0), DELTA) == 0.0
    assert prv_epsilon(ComposedEvent(()), DELTA) == 0.0


def test_a_failing_accountant_gives_none_not_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __init__(
            self, *, prvs: object, max_self_compositions: object, eps_error: float, delta_error: float
        ) -> None:
            raise RuntimeError("Discrete mean differs from continuous mean significantly.")

    monkeypatch.setattr(prv_module, "PRVAccountant", Broken)
    assert prv_epsilon(GaussianEvent(1.0, 1), DELTA) is None


def test_a_non_finite_answer_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    class Infinite:
        def __init__(
            self, *, prvs: object, max_self_compositions: object, eps_error: float, delta_error: float
        ) -> None:
            pass

        def compute_epsilon(self, *, delta: float, num_self_compositions: object) -> tuple[float, float, float]:
            return (math.inf, math.inf, math.inf)

    monkeypatch.setattr(prv_module, "PRVAccountant", Infinite)
    assert prv_epsilon(GaussianEvent(1.0, 1), DELTA) is None


@pytest.mark.parametrize("delta", [0.0, 1.0, math.nan])
def test_invalid_delta_raises(delta: float) -> None:
    with pytest.raises(PrivacyEventError):
        prv_epsilon(GaussianEvent(1.0, 1), delta)
