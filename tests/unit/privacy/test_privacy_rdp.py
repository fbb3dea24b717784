"""RDP curves: closed forms, numerical integration, Google's dp_accounting and 40-digit mpmath."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from prv_accountant import LaplaceMechanism
from scipy import integrate

from kernel.privacy import (
    ORDERS,
    ComposedEvent,
    ExponentialMechanismEvent,
    GaussianEvent,
    LaplaceEvent,
    PoissonSampledGaussianEvent,
    PrivacyEventError,
    PureDPEvent,
    ZCDPEvent,
    rdp_curve,
)
from kernel.privacy.rdp import SUBSAMPLED_GAUSSIAN_ABS_MARGIN

ROUNDING = 1e-11  # our outward rounding is ~1e-12 relative per operation


def _close_above(ours: float, exact: float, *, rel: float = ROUNDING) -> None:
    """ours is an upper bound on exact and not a loose one."""
    assert ours >= exact, (ours, exact)
    assert ours <= exact * (1 + rel) + 1e-300, (ours, exact)


def test_orders_grid() -> None:
    assert ORDERS == (
        1.25,
        1.5,
        1.75,
        2.0,
        2.5,
        3.0,
        4.0,
        5.0,
        6.0,
        8.0,
        10.0,
        12.0,
        16.0,
        20.0,
        24.0,
        32.0,
        48.0,
        64.0,
        128.0,
        256.0,
    )
    assert list(ORDERS) == sorted(set(ORDERS))


@pytest.mark.parametrize(("sigma", "count"), [(1.0, 1), (0.7, 30), (10.0, 100), (123.4, 7)])
def test_gaussian_is_the_closed_form(sigma: float, count: int) -> None:
    for order, value in zip(ORDERS, rdp_curve(GaussianEvent(sigma, count)), strict=True):
        _close_above(value, count * order / (2 * sigma**2))


def test_subsampled_gaussian_with_q_one_is_the_plain_gaussian() -> None:
    assert rdp_curve(PoissonSampledGaussianEvent(1.0, 10.0, 100)) == rdp_curve(GaussianEvent(10.0, 100))


def _laplace_rdp_by_quadrature(b: float, order: float) -> float:
    """D_a(Lap(0,b) || Lap(1,b)) by integrating p^a q^(1-a) numerically (independent of the formula)."""

    def integrand(x: float) -> float:
        return math.exp(-(order * abs(x) + (1 - order) * abs(x - 1)) / b) / (2 * b)

    total = sum(
        integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
        for lo, hi in ((-np.inf, 0.0), (0.0, 1.0), (1.0, np.inf))
    )
    return math.log(total) / (order - 1)


@pytest.mark.parametrize("b", [0.5, 1.0, 3.0, 20.0])
@pytest.mark.parametrize("order", [1.25, 2.0, 2.5, 8.0, 32.0])
def test_laplace_matches_numerical_integration(b: float, order: float) -> None:
    index = ORDERS.index(order)
    ours = rdp_curve(LaplaceEvent(b, 1))[index]
    reference = _laplace_rdp_by_quadrature(b, order)
    assert ours == pytest.approx(reference, rel=1e-8)


@pytest.mark.parametrize("b", [0.01, 0.3, 1.0, 2.0, 10.0, 1e3, 1e5])
def test_laplace_agrees_with_dp_accounting_and_prv_accountant(b: float) -> None:
    ours = rdp_curve(LaplaceEvent(b, 3))
    google = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    google.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=b), 3)
    microsoft = LaplaceMechanism(mu=1.0 / b)  # mu is the privacy-loss bound 1/b, not b
    for order, value, g in zip(ORDERS, ours, google.rdp, strict=True):
        assert value == pytest.approx(g, rel=1e-9)
        assert value <= 3 / b * (1 + ROUNDING)  # never above pure eps = 1/b per use
        with np.errstate(over="ignore"):
            m = 3 * float(microsoft.rdp(order))
        if math.isfinite(m) and b <= 10.0:
            # prv-accountant's direct formula overflows for small b and cancels for large b.
            assert value == pytest.approx(m, rel=1e-9)


@pytest.mark.parametrize("b", [1e5, 1e3, 10.0, 1.9, 0.3])
def test_laplace_is_an_upper_bound_of_the_40_digit_value(b: float) -> None:
    """Where a*eps is small the two exponentials in Mironov's formula cancel to first order; a
    direct log-sum-exp would lose ~all digits at b = 1e5, so rdp.py sums a Taylor series there."""
    mp = pytest.importorskip("mpmath")
    ours = rdp_curve(LaplaceEvent(b, 1))
    with mp.workdps(40):
        eps = 1 / mp.mpf(b)
        for order, value in zip(ORDERS, ours, strict=True):
            a = mp.mpf(order)
            moment = a / (2 * a - 1) * mp.exp((a - 1) * eps) + (a - 1) / (2 * a - 1) * mp.exp(-a * eps)
            exact = float(mp.log(moment) / (a - 1))
            _close_above(value, exact)


@pytest.mark.parametrize("eps", [0.01, 0.5, 1.0, 3.0])
def test_pure_dp_and_exponential_mechanism_closed_forms(eps: float) -> None:
    pure = rdp_curve(PureDPEvent(eps, 4))
    bounded_range = rdp_curve(ExponentialMechanismEvent(eps, 4))
    for order, p, b in zip(ORDERS, pure, bounded_range, strict=True):
        _close_above(p, 4 * min(eps, order * eps**2 / 2))
        _close_above(b, 4 * min(eps, order * eps**2 / 8))


def test_zcdp_closed_form() -> None:
    for order, value in zip(ORDERS, rdp_curve(ZCDPEvent(0.02, 9)), strict=True):
        _close_above(value, 9 * 0.02 * order)


SUBSAMPLED_CASES = [(0.01, 1.0, 1000), (0.1, 2.0, 100), (0.02, 1.1, 5000), (1.0, 10.0, 100)]


@pytest.mark.parametrize(("q", "sigma", "steps"), SUBSAMPLED_CASES)
def test_subsampled_gaussian_agrees_with_dp_accounting(q: float, sigma: float, steps: int) -> None:
    """Integer orders agree to 1e-6. At the fractional orders (1.25, 1.5, 1.75, 2.5) dp_accounting
    0.6.0 is LARGER: its _compute_log_a_frac adds |binom(a, k)| for every k, although binom(a, k)
    alternates in sign for k > a, so it returns a (valid, looser) upper bound. prv-accountant keeps
    the signs and matches the 40-digit integral (test below), so there ours must be <= Google's."""
    google = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    google.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    ours = rdp_curve(PoissonSampledGaussianEvent(q, sigma, steps))
    for order, value, g in zip(ORDERS, ours, google.rdp, strict=True):
        if order == int(order) or q == 1.0:
            assert value == pytest.approx(g, rel=1e-6), order
        else:
            assert value <= g, order
            exact = steps * _subsampled_gaussian_rdp_mpmath(q, sigma=sigma, order=order)
            assert value == pytest.approx(exact, rel=1e-6), order


# Points where prv-accountant's double-precision computation was measured to be least accurate
# (absolute error up to ~6e-13 below the truth, or even negative for tiny q).
MPMATH_CASES = [
    (0.05, 0.3, 1.25),
    (0.3, 3.0, 1.25),
    (0.5, 300.0, 1.25),
    (1e-5, 0.3, 1.25),
    (0.1, 2.0, 1.75),
    (0.01, 1.0, 2.5),
    (1e-8, 2.0, 1.25),
    (1e-8, 1.0, 64.0),
    (0.02, 1.1, 256.0),
    (0.9999, 0.5, 3.0),
]


def _subsampled_gaussian_rdp_mpmath(q: float, *, sigma: float, order: float) -> float:
    """Mironov-Talwar-Zhang 2019: log E_{z~N(0,s^2)}[((1-q) + q e^{(2z-1)/(2s^2)})^a] / (a-1), 40 digits."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(40):
        q_, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(order)
        if order == int(order):
            moment = mp.fsum(
                mp.binomial(int(order), k) * (1 - q_) ** (int(order) - k) * q_**k * mp.exp((k * k - k) / (2 * s * s))
                for k in range(int(order) + 1)
            )
        else:
            moment = mp.quad(
                lambda z: mp.npdf(z, 0, s) * ((1 - q_) + q_ * mp.exp((2 * z - 1) / (2 * s * s))) ** a,
                [-mp.inf, -10 * s, 0, 0.5, 1, 2, 5, 10 * s + 3 * a / s**2, mp.inf],
            )
        return float(mp.log(moment) / (a - 1))


@pytest.mark.parametrize(("q", "sigma", "order"), MPMATH_CASES)
def test_subsampled_gaussian_is_an_upper_bound_of_the_40_digit_value(q: float, sigma: float, order: float) -> None:
    exact = _subsampled_gaussian_rdp_mpmath(q, sigma=sigma, order=order)
    ours = rdp_curve(PoissonSampledGaussianEvent(q, sigma, 1))[ORDERS.index(order)]
    assert ours >= exact
    assert ours <= exact * (1 + 1e-9) + 2 * SUBSAMPLED_GAUSSIAN_ABS_MARGIN


def test_count_and_composition_add_up() -> None:
    a = PoissonSampledGaussianEvent(0.01, 1.0, 500)
    b = LaplaceEvent(3.0, 2)
    one = rdp_curve(PoissonSampledGaussianEvent(0.01, 1.0, 1))
    composed = rdp_curve(ComposedEvent((a, b, ComposedEvent((a,)))))
    for x, y, z, total in zip(one, rdp_curve(a), rdp_curve(b), composed, strict=True):
        assert y == pytest.approx(500 * x, rel=1e-11)
        assert total >= 2 * y + z
        assert total == pytest.approx(2 * y + z, rel=1e-10)


def test_zero_count_and_empty_composition_cost_nothing() -> None:
    assert rdp_curve(GaussianEvent(1.0, 0)) == (0.0,) * len(ORDERS)
    assert rdp_curve(ComposedEvent(())) == (0.0,) * len(ORDERS)


def test_costs_never_underflow_to_zero() -> None:
    assert all(v > 0.0 for v in rdp_curve(GaussianEvent(1e200, 1)))
    assert all(v > 0.0 for v in rdp_curve(PureDPEvent(1e-200, 1)))


@pytest.mark.parametrize(
    "event",
    [
        GaussianEvent(1e-160, 1),
        ZCDPEvent(1e300, 10**10),
        LaplaceEvent(1e-320, 1),
        PoissonSampledGaussianEvent(0.5, 1e-160, 1),
    ],
)
def test_non_finite_costs_are_refused(event: object) -> None:
    with pytest.raises(PrivacyEventError):
        rdp_curve(event)  # type: ignore[arg-type]


def test_costs_grow_with_less_noise_and_more_steps() -> None:
    base = rdp_curve(PoissonSampledGaussianEvent(0.05, 1.5, 100))
    noisier = rdp_curve(PoissonSampledGaussianEvent(0.05, 1.6, 100))
    longer = rdp_curve(PoissonSampledGaussianEvent(0.05, 1.5, 101))
    assert all(n < b < lo for n, b, lo in zip(noisier, base, longer, strict=True))
