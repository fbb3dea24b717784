"""RDP -> (eps, delta) conversion, its inverse (capacities), and hand-checkable anchors."""

from __future__ import annotations

import math

import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, stats

from kernel.privacy import (
    ORDERS,
    GaussianEvent,
    PoissonSampledGaussianEvent,
    PrivacyEventError,
    capacity_curve,
    epsilon_from_rdp,
    ledger_epsilon,
    rdp_curve,
)

# (q, sigma, T) -> (eps_RDP, eps_PLD) at delta = 1e-5, from the project's spec (dp_accounting,
# its default order grid).
SUBSAMPLED_ANCHORS = {
    (0.01, 1.0, 1000): (2.1014, 1.8282),
    (0.1, 2.0, 100): (2.5806, 2.3374),
    (0.02, 1.1, 5000): (8.5148, 7.8609),
}


def gdp_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of a mu-GDP mechanism (Dong, Roth, Su 2019, Cor. 2.13)."""

    def excess(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta

    return float(optimize.brentq(excess, 0.0, 100.0, xtol=1e-12))


def test_gdp_anchor_is_what_the_spec_says() -> None:
    assert gdp_epsilon(1.0, 1e-5) == pytest.approx(4.3772, abs=1e-4)


def test_rdp_numbers_of_the_gaussian_anchor_are_upper_bounds() -> None:
    # q = 1, sigma = 10, T = 100 is a Gaussian with mu = sqrt(T)/sigma = 1.
    curve = rdp_curve(PoissonSampledGaussianEvent(1.0, 10.0, 100))
    exact = gdp_epsilon(1.0, 1e-5)
    eps, _ = epsilon_from_rdp(curve, 1e-5)
    assert exact <= eps <= exact * 1.12
    assert ledger_epsilon(curve, 1e-5) >= eps  # the ledger pays delta/|A| per order: even larger


@pytest.mark.parametrize(("params", "anchor"), SUBSAMPLED_ANCHORS.items())
def test_rdp_epsilon_of_subsampled_anchors(params: tuple[float, float, int], anchor: tuple[float, float]) -> None:
    eps_rdp, eps_pld = anchor
    eps, _ = epsilon_from_rdp(rdp_curve(PoissonSampledGaussianEvent(*params)), 1e-5)
    assert eps_rdp <= eps <= eps_rdp * 1.03
    assert eps >= eps_pld


@pytest.mark.parametrize(
    "event",
    [PoissonSampledGaussianEvent(*p) for p in SUBSAMPLED_ANCHORS] + [GaussianEvent(10.0, 100), GaussianEvent(0.8, 3)],
)
@pytest.mark.parametrize("delta", [1e-5, 1e-8, 5e-7])
def test_conversion_matches_dp_accounting(event: object, delta: float) -> None:
    """dp_accounting.rdp.compute_epsilon uses the same CKS conversion. Differences, all making ours
    larger or equal: we round up (~1e-12); dp_accounting also returns 0 at an order where
    delta^2 + expm1(-r) > 0 (a KL bound, only for r < ~delta^2) and skips orders <= 1.01 (our grid
    has none)."""
    curve = rdp_curve(event)  # type: ignore[arg-type]
    ours, order = epsilon_from_rdp(curve, delta)
    theirs, their_order = rdp_privacy_accountant.compute_epsilon(list(ORDERS), list(curve), delta)
    assert ours >= theirs
    assert ours == pytest.approx(theirs, rel=1e-10)
    assert order == their_order


def test_kl_shortcut_is_where_dp_accounting_is_less_conservative() -> None:
    tiny = (1e-14,) * len(ORDERS)
    theirs, _ = rdp_privacy_accountant.compute_epsilon(list(ORDERS), list(tiny), 1e-5)
    ours, _ = epsilon_from_rdp(tiny, 1e-5)
    assert theirs == 0.0
    assert ours > 0.0  # we never use the KL shortcut: the pure CKS bound, a little larger


def test_conversion_formula_by_hand() -> None:
    curve = tuple(0.01 * a for a in ORDERS)  # rho = 0.01 zCDP
    eps, order = epsilon_from_rdp(curve, 1e-6)
    by_hand = [0.01 * a + math.log1p(-1 / a) - (math.log(1e-6) + math.log(a)) / (a - 1) for a in ORDERS]
    assert eps == pytest.approx(min(by_hand), rel=1e-12)
    assert eps >= min(by_hand)
    assert order == ORDERS[by_hand.index(min(by_hand))]
    assert ledger_epsilon(curve, 1e-6) == epsilon_from_rdp(curve, 1e-6 / len(ORDERS))[0]


def test_epsilon_is_clamped_at_zero_and_handles_infinite_orders() -> None:
    assert epsilon_from_rdp((0.0,) * len(ORDERS), 0.9)[0] == 0.0
    curve = (math.inf,) * (len(ORDERS) - 1) + (1.0,)
    eps, order = epsilon_from_rdp(curve, 1e-5)
    assert order == 256.0 and math.isfinite(eps)
    assert epsilon_from_rdp((math.inf,) * len(ORDERS), 1e-5)[0] == math.inf


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 8.0, 40.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_capacity_is_the_largest_value_that_converts_to_the_budget(epsilon: float, delta: float) -> None:
    capacity = capacity_curve(epsilon, delta)
    assert ledger_epsilon(capacity, delta) == pytest.approx(epsilon, rel=1e-10)
    for index, value in enumerate(capacity):
        alone = [math.inf] * len(ORDERS)
        alone[index] = value
        if value > 0.0:
            assert ledger_epsilon(alone, delta) <= epsilon * (1 + 1e-11)
            alone[index] = value * (1 + 1e-9) + 1e-12
            assert ledger_epsilon(alone, delta) > epsilon
        else:  # clamped: even zero RDP at this order converts to more than the budget
            assert ledger_epsilon(alone, delta) >= epsilon


@pytest.mark.parametrize(("epsilon", "delta"), [(8.0, 1e-5), (0.7, 1e-9), (1.0, 1e-5)])
def test_conversion_and_capacity_are_on_the_safe_side_in_40_digits(epsilon: float, delta: float) -> None:
    mp = pytest.importorskip("mpmath")
    with mp.workdps(40):
        order_delta = mp.mpf(delta) / len(ORDERS)

        def exact_epsilon(rdp: float, order: float) -> object:
            a = mp.mpf(order)
            return mp.mpf(rdp) + mp.log1p(-1 / a) - (mp.log(order_delta) + mp.log(a)) / (a - 1)

        capacity = capacity_curve(epsilon, delta)
        for order, value in zip(ORDERS, capacity, strict=True):
            if value > 0.0:
                assert exact_epsilon(value, order) <= epsilon  # capacities never exceed the budget
                assert exact_epsilon(value, order) >= epsilon * (1 - 1e-10)  # ...and are tight
        curve = rdp_curve(PoissonSampledGaussianEvent(0.01, 1.0, 1000))
        reported = ledger_epsilon(curve, delta)
        assert reported >= min(exact_epsilon(r, a) for r, a in zip(curve, ORDERS, strict=True))


def test_capacity_clamps_small_budgets_to_zero() -> None:
    capacity = capacity_curve(0.05, 1e-5)
    assert capacity[0] == 0.0 and all(v >= 0.0 for v in capacity)
    assert capacity_curve(8.0, 1e-5) > capacity_curve(4.0, 1e-5)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, math.nan, math.inf, True])
def test_invalid_delta_is_refused(delta: float) -> None:
    with pytest.raises(PrivacyEventError):
        epsilon_from_rdp((0.1,) * len(ORDERS), delta)
    with pytest.raises(PrivacyEventError):
        capacity_curve(1.0, delta)


@pytest.mark.parametrize("curve", [(0.1,) * 3, (math.nan,) * len(ORDERS), (-0.1,) + (0.1,) * (len(ORDERS) - 1)])
def test_invalid_curves_are_refused(curve: tuple[float, ...]) -> None:
    with pytest.raises(PrivacyEventError):
        epsilon_from_rdp(curve, 1e-5)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan, math.inf])
def test_invalid_budget_is_refused(epsilon: float) -> None:
    with pytest.raises(PrivacyEventError):
        capacity_curve(epsilon, 1e-5)
