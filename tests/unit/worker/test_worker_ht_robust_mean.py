"""The smoothed Catoni robust estimator (U1–U4): values, numerics, bounds and sensitivity."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from algorithms.ht_dpsco.calibration import PHI_BOUND, robust_mean_sensitivity
from algorithms.ht_dpsco.robust_mean import (
    PHI_SUP,
    phi,
    robust_mean_sum,
    robust_terms,
    smoothed_truncation,
    smoothed_truncation_unclipped,
)

SQRT2 = math.sqrt(2.0)


def _t(values: object) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def _reference(a: float, b: float) -> float:
    """E φ(a + bZ) by adaptive quadrature with the peak and the kinks as breakpoints."""

    def integrand(x: float) -> float:
        value = x - x**3 / 6 if abs(x) <= SQRT2 else math.copysign(PHI_BOUND, x)
        return value * stats.norm.pdf(x, loc=a, scale=b)

    lo, hi = a - 40 * b, a + 40 * b
    points = sorted(p for p in (a, -SQRT2, SQRT2) if lo < p < hi)
    value, _ = integrate.quad(integrand, lo, hi, points=points, limit=500, epsabs=1e-13, epsrel=1e-12)
    return value


# ----------------------------------------------------------------------------- U1


def test_phi_values_continuity_and_shape() -> None:
    x = _t([0.0, 1.0, -1.0, SQRT2, -SQRT2, 10.0, -10.0])
    expected = _t([0.0, 5 / 6, -5 / 6, PHI_BOUND, -PHI_BOUND, PHI_BOUND, -PHI_BOUND])
    assert torch.allclose(phi(x), expected, atol=1e-15)
    grid = torch.linspace(-6, 6, 20001, dtype=torch.float64)
    values = phi(grid)
    assert torch.equal(values, -phi(-grid))
    assert bool((values.diff() >= -1e-15).all())
    assert float(values.abs().max()) <= 0.9428090416 + 1e-12
    u = grid
    assert bool((values <= torch.log(1 + u + u * u / 2) + 1e-12).all())
    assert bool((values >= -torch.log(1 - u + u * u / 2) - 1e-12).all())


# ----------------------------------------------------------------------------- U2


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0.3, 0.3, 0.282001),
        (1.0, 1.0, 0.564087),
        (2.0, 2.0, 0.621625),
        (-3.0, 3.0, -0.633666),
        (10.0, 10.0, 0.642735),
    ],
)
def test_golden_values(a: float, b: float, expected: float) -> None:
    assert float(smoothed_truncation(_t(a), _t(b))) == pytest.approx(expected, abs=6e-7)


# |a| ∈ {10⁻³ … 10⁴}, b ∈ {0.1, 1, 10}·|a|, both signs; only b ≥ 0.01, where the adaptive
# quadrature reference itself is reliable.
GRID = [
    (sign * magnitude, ratio * magnitude)
    for magnitude in (1e-3, 1e-2, 0.1, 1.0, 10.0, 99.0, 101.0, 1e3, 1e4)
    for ratio in (0.1, 1.0, 10.0)
    for sign in (1.0, -1.0)
    if ratio * magnitude >= 0.01
]


@pytest.mark.parametrize(("a", "b"), GRID)
def test_unclipped_evaluator_matches_adaptive_quadrature(a: float, b: float) -> None:
    """The check that catches sign errors in Ĉ ([R]'s c2 gives −2.52 at a = b = 5)."""
    assert float(smoothed_truncation_unclipped(_t(a), _t(b))) == pytest.approx(_reference(a, b), abs=1e-8)


def test_the_reference_implementations_sign_error_would_be_caught() -> None:
    value = float(smoothed_truncation_unclipped(_t(5.0), _t(5.0)))
    assert value == pytest.approx(0.640, abs=1e-3)
    assert value == pytest.approx(_reference(5.0, 5.0), abs=1e-9)


def test_monte_carlo_agreement() -> None:
    rng = np.random.default_rng(0)
    z = torch.from_numpy(rng.standard_normal(1_000_000))
    for a, b in [(0.5, 0.7), (1.5, 2.0), (-4.0, 1.0)]:
        draws = phi(a + b * z)
        se = float(draws.std()) / 1000.0
        assert abs(float(draws.mean()) - float(smoothed_truncation(_t(a), _t(b)))) < 5 * se


def test_odd_limit_and_degenerate_inputs() -> None:
    grid = _t([1e-3, 0.5, 3.0, 50.0, 500.0])
    assert torch.allclose(smoothed_truncation(grid, grid), -smoothed_truncation(-grid, grid), atol=1e-15)
    limit = PHI_BOUND * (2 * stats.norm.cdf(1.0) - 1)
    assert limit == pytest.approx(0.6436458, abs=1e-7)
    assert float(smoothed_truncation(_t(1e4), _t(1e4))) == pytest.approx(limit, abs=1e-5)
    assert float(smoothed_truncation(_t(0.0), _t(0.0))) == 0.0
    tiny = smoothed_truncation(_t([1e-300, 1e-10]), _t([1e-300, 1e-10]))
    assert bool(torch.isfinite(tiny).all()) and torch.allclose(tiny, _t([1e-300, 1e-10]))


@settings(max_examples=80, deadline=None)
@given(a=st.floats(-1e8, 1e8), ratio=st.floats(0, 1e3))
def test_clipped_output_is_always_within_the_bound(a: float, ratio: float) -> None:
    value = float(smoothed_truncation(_t(a), _t(abs(a) * ratio)))
    assert math.isfinite(value) and abs(value) <= PHI_BOUND


def test_bound_holds_for_non_finite_gradients() -> None:
    g = _t([float("inf"), float("-inf"), float("nan"), 1e300, -1e300, 0.0])
    terms = robust_terms(g, kappa=0.5, beta=1.0, term_bound=PHI_BOUND)
    assert bool(torch.isfinite(terms).all()) and float(terms.abs().max()) <= 0.5 * PHI_BOUND
    assert float(terms[2]) == 0.0 and float(terms[5]) == 0.0


# ----------------------------------------------------------------------------- U3


def test_huge_scale_gives_the_sample_mean_and_zero_maps_to_zero() -> None:
    rng = np.random.default_rng(1)
    g = torch.from_numpy(rng.standard_t(3, size=(500, 4)))
    kappa = 1e8 * float(g.abs().max())
    mean = robust_mean_sum(g, kappa=kappa, beta=1.0, term_bound=PHI_BOUND) / 500
    assert torch.allclose(mean, g.mean(dim=0), rtol=1e-6)
    assert float(robust_terms(_t([0.0]), kappa=3.0, beta=2.0, term_bound=PHI_BOUND)) == 0.0


def test_lemma4_coverage() -> None:
    """Student-t(3) (τ = 3), m = 2000, β = 1, ζ = 0.1: violations of the Lemma 4 bound ≤ ζ."""
    tau, m, zeta, beta, reps = 3.0, 2000, 0.1, 1.0, 500
    kappa = math.sqrt(tau * m / math.log(2 / zeta))
    rng = np.random.default_rng(2)
    g = torch.from_numpy(rng.standard_t(3, size=(m, reps)))
    estimates = robust_mean_sum(g, kappa=kappa, beta=beta, term_bound=PHI_BOUND, chunk_rows=m) / m
    bound = tau / (2 * kappa) * (1 / beta + 1) + kappa / m * (beta / 2 + math.log(2 / zeta))
    assert float((estimates.abs() > bound).double().mean()) <= zeta


# ----------------------------------------------------------------------------- U4


@pytest.mark.parametrize("kappa", [0.3, 5.0])
def test_adversarial_replacement_moves_each_coordinate_by_at_most_the_sensitivity(kappa: float) -> None:
    """Replace-one: ≤ 4√2κ/(3m); add/remove (charged): ≤ 2√2κ/(3m)."""
    m = 50
    rng = np.random.default_rng(3)
    base = torch.from_numpy(rng.standard_t(2, size=(m, 3)) * 10)
    before = robust_mean_sum(base, kappa=kappa, beta=1.0, term_bound=PHI_BOUND) / m
    add_remove = robust_mean_sensitivity(kappa=kappa, block_size=m)
    for value in [1e300, -1e300, float("inf"), float("-inf"), float("nan"), 0.0, kappa * 1e6, -kappa * 1e6]:
        replaced = base.clone()
        replaced[7] = value
        after = robust_mean_sum(replaced, kappa=kappa, beta=1.0, term_bound=PHI_BOUND) / m
        assert float((after - before).abs().max()) <= 2 * add_remove + 1e-12
        removed = robust_mean_sum(torch.cat([base[:7], base[8:]]), kappa=kappa, beta=1.0, term_bound=PHI_BOUND) / m
        added = robust_mean_sum(torch.cat([base, replaced[7:8]]), kappa=kappa, beta=1.0, term_bound=PHI_BOUND) / m
        assert float((removed - before).abs().max()) <= add_remove + 1e-12
        assert float((added - before).abs().max()) <= add_remove + 1e-12


def test_phi_definition_matches_the_catalogue_bound() -> None:
    """φ's own sup (its definition here) is the bound the catalogue's sensitivity assumes."""
    assert PHI_SUP == PHI_BOUND
    assert float(phi(_t([SQRT2]))) == pytest.approx(PHI_BOUND, rel=1e-15)


def test_terms_are_clipped_to_the_bound_passed_in() -> None:
    """The privacy clip uses the caller's (the catalogue's) bound, not a copy in this module."""
    g = _t([[1e6, -1e6, 0.3]])
    terms = robust_terms(g, kappa=2.0, beta=1.0, term_bound=0.1)
    assert float(terms.abs().max()) == pytest.approx(0.2, rel=1e-15)
    assert float(robust_terms(g, kappa=2.0, beta=1.0, term_bound=PHI_BOUND).abs().max()) > 0.2
    with pytest.raises(ValueError):
        robust_terms(g, kappa=2.0, beta=1.0, term_bound=float("inf"))
