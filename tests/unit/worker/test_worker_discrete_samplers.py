"""Exact discrete samplers: distributions, grid (Mironov) property, exact privacy bounds, speed."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dp.randomness.discrete_samplers import (
    bernoulli_exp_neg,
    discrete_laplace,
    exponential_mechanism,
    exponential_mechanism_parameters,
    report_noisy_max,
    report_noisy_max_parameters,
    snapped_laplace,
    snapped_laplace_parameters,
)

_P_MIN = 1e-4  # χ² p-value floor with fixed seeds


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _dlap_pmf(z: np.ndarray, t: int) -> np.ndarray:
    q = math.exp(-1.0 / t)
    return (1 - q) / (1 + q) * q ** np.abs(z)


# ----------------------------------------------------------------------------- Bernoulli


@pytest.mark.parametrize("gamma", [0.0, 0.3, 1.0, 2.7, 10.0])
def test_bernoulli_exp_neg_matches_exp_minus_gamma(gamma: float) -> None:
    k = 40
    num = round(gamma * 2**k)
    n = 400_000
    draws = bernoulli_exp_neg(_rng(1), np.full(n, num, dtype=np.int64), denominator_log2=k)
    p = math.exp(-num / 2**k)
    assert draws.dtype == bool and draws.shape == (n,)
    assert abs(draws.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_bernoulli_exp_neg_zero_is_always_true_and_shape_kept() -> None:
    out = bernoulli_exp_neg(_rng(2), np.zeros((3, 4), dtype=np.int64), denominator_log2=40)
    assert out.shape == (3, 4) and out.all()


def test_bernoulli_exp_neg_mixed_vector() -> None:
    gammas = np.array([0.0, 0.5, 3.0])
    num = np.tile(np.round(gammas * 2**20).astype(np.int64), 100_000)
    out = bernoulli_exp_neg(_rng(3), num, denominator_log2=20).reshape(-1, 3)
    assert np.allclose(out.mean(axis=0), np.exp(-gammas), atol=0.005)


@pytest.mark.parametrize(
    ("numerators", "k"),
    [(np.array([-1]), 10), (np.array([0.5]), 10), (np.array([1]), -1), (np.array([1]), 51)],
)
def test_bernoulli_exp_neg_rejects_bad_input(numerators: np.ndarray, k: int) -> None:
    with pytest.raises(ValueError):
        bernoulli_exp_neg(_rng(0), numerators, denominator_log2=k)


# ----------------------------------------------------------------------------- discrete Laplace


@pytest.mark.parametrize("t", [1, 3, 50])
def test_discrete_laplace_goodness_of_fit(t: int) -> None:
    n = 200_000
    z = discrete_laplace(_rng(10 + t), n, scale=t)
    assert z.dtype == np.int64 and z.shape == (n,)
    support = np.arange(-1, 2)
    while n * _dlap_pmf(np.array([support[-1] + 1]), t)[0] >= 5:
        support = np.arange(support[0] - 1, support[-1] + 2)
    p_in = _dlap_pmf(support, t)
    tail = (1 - p_in.sum()) / 2
    observed = np.concatenate(
        [
            [np.sum(z < support[0])],
            np.bincount(
                np.clip(z - support[0], 0, support.size)[(z >= support[0]) & (z <= support[-1])], minlength=support.size
            ),
            [np.sum(z > support[-1])],
        ]
    )
    expected = n * np.concatenate([[tail], p_in, [tail]])
    assert stats.chisquare(observed, expected).pvalue > _P_MIN
    # symmetry: sign test and mean
    pos, neg = int(np.sum(z > 0)), int(np.sum(z < 0))
    assert stats.binomtest(pos, pos + neg).pvalue > _P_MIN
    assert abs(z.mean()) < 5 * z.std() / math.sqrt(n)


def test_discrete_laplace_shape_and_validation() -> None:
    assert discrete_laplace(_rng(0), (2, 3), scale=4).shape == (2, 3)
    assert discrete_laplace(_rng(0), 0, scale=4).shape == (0,)
    for bad in (0, -3, 1.5, True, 2**51):
        with pytest.raises(ValueError):
            discrete_laplace(_rng(0), 5, scale=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        discrete_laplace(_rng(0), -1, scale=3)


# ----------------------------------------------------------------------------- snapped Laplace


def test_snapped_laplace_outputs_lie_on_a_grid_independent_of_the_input() -> None:
    scale, delta = 0.7, 0.3
    grid = snapped_laplace_parameters(scale=scale, l1_sensitivity=delta, dimension=5000).grid
    for seed, x in ((20, 0.123456789), (21, 0.123456789 + delta), (22, math.pi * 1e3)):
        out = snapped_laplace(_rng(seed), np.full(5000, x), scale=scale, l1_sensitivity=delta)
        units = out / grid
        assert np.array_equal(units, np.rint(units))  # every output is a multiple of the same γ
    assert math.log2(grid) == math.floor(math.log2(scale)) - 40


def test_snapped_laplace_moments_and_shape() -> None:
    scale, n = 2.5, 100_000
    values = np.full((n // 10, 10), 4.0)
    out = snapped_laplace(_rng(23), values, scale=scale, l1_sensitivity=1.0)
    assert out.shape == values.shape and out.dtype == np.float64
    noise = out - 4.0
    assert abs(noise.std() / (math.sqrt(2) * scale) - 1) < 0.03
    assert abs(noise.mean()) < 5 * math.sqrt(2) * scale / math.sqrt(n)


def test_snapped_laplace_non_finite_values_are_mapped() -> None:
    out = snapped_laplace(_rng(24), np.array([np.nan, np.inf, -np.inf]), scale=1.0, l1_sensitivity=1.0)
    assert abs(out[0]) < 100 and out[1] == 2.0**1000 and out[2] == -(2.0**1000)


@pytest.mark.parametrize(("scale", "delta"), [(0.0, 1.0), (1.0, -1.0), (math.inf, 1.0), (1.0, math.nan)])
def test_snapped_laplace_rejects_bad_parameters(scale: float, delta: float) -> None:
    with pytest.raises(ValueError):
        snapped_laplace(_rng(0), np.zeros(3), scale=scale, l1_sensitivity=delta)


@settings(max_examples=200, deadline=None)
@given(
    scale=st.floats(1e-8, 1e8),
    epsilon=st.floats(1e-6, 1e3),
    dimension=st.integers(0, 100_000),
)
def test_snapped_laplace_epsilon_never_exceeds_the_charged_one(scale: float, epsilon: float, dimension: int) -> None:
    delta = epsilon * scale
    p = snapped_laplace_parameters(scale=scale, l1_sensitivity=delta, dimension=dimension)
    exact = (Fraction(delta) + dimension * Fraction(p.grid)) / (p.noise_units * Fraction(p.grid))
    assert exact <= Fraction(delta) / Fraction(scale)
    assert p.epsilon <= delta / scale
    assert p.epsilon >= (delta / scale) * (1 - 1e-3)  # the inflation costs (almost) nothing


@settings(max_examples=200, deadline=None)
@given(
    scale=st.floats(0.05, 20.0),
    epsilon=st.floats(0.05, 5.0),
    grid_bits=st.integers(0, 4),
    x=st.lists(st.floats(-50, 50), min_size=1, max_size=3),
    direction=st.lists(st.floats(-1, 1), min_size=3, max_size=3),
)
def test_snapped_laplace_exact_pmf_privacy_loss(
    scale: float, epsilon: float, grid_bits: int, x: list[float], direction: list[float]
) -> None:
    """Neighbours x, x + v with ‖v‖₁ ≤ Δ; enumerate the pmf of the integer output N on the grid."""
    delta = epsilon * scale
    d = len(x)
    p = snapped_laplace_parameters(scale=scale, l1_sensitivity=delta, dimension=d, grid_bits=grid_bits)
    v = np.array(direction[:d])
    norm = np.abs(v).sum()
    v = v / norm * delta * 0.999999 if norm > 0 else v
    xs, ys = np.array(x), np.array(x) + v
    n, n2 = np.rint(xs / p.grid).astype(int), np.rint(ys / p.grid).astype(int)
    t = p.noise_units
    for i in range(d):  # per-coordinate log-ratio over an enumerated support window
        support = np.arange(min(n[i], n2[i]) - 30 * t, max(n[i], n2[i]) + 30 * t + 1)
        log_ratio = (np.abs(support - n2[i]) - np.abs(support - n[i])) / t
        assert np.max(np.abs(log_ratio)) == pytest.approx(abs(n[i] - n2[i]) / t)
    # the joint pmf ratio is the product; its maximum is exp(‖n - n'‖₁ / t)
    assert Fraction(int(np.abs(n - n2).sum()), t) <= Fraction(delta) / Fraction(scale)
    assert p.epsilon <= delta / scale


# ----------------------------------------------------------------------------- report-noisy-max


def test_report_noisy_max_picks_the_clear_winner() -> None:
    rng = _rng(30)
    picks = [report_noisy_max(rng, np.array([0.0, 1.0, 30.0, 2.0]), scale=1.0, sensitivity=1.0) for _ in range(500)]
    assert picks.count(2) >= 495


def test_report_noisy_max_never_picks_masked_candidates() -> None:
    rng = _rng(31)
    scores = np.array([-np.inf, 0.0, -np.inf, 0.5, -np.inf])
    picks = {report_noisy_max(rng, scores, scale=100.0, sensitivity=1.0) for _ in range(400)}
    assert picks <= {1, 3} and picks == {1, 3}


def test_report_noisy_max_is_uniform_over_exact_ties() -> None:
    """grid_bits=0: t = 3 grid units, so exact ties of the noisy scores are frequent (~20 %)."""
    rng = _rng(32)
    p = report_noisy_max_parameters(scale=1.0, sensitivity=1.0, grid_bits=0)
    assert p.noise_units <= 4
    counts = np.bincount(
        [report_noisy_max(rng, np.zeros(3), scale=1.0, sensitivity=1.0, grid_bits=0) for _ in range(6000)], minlength=3
    )
    assert stats.chisquare(counts).pvalue > _P_MIN


def _rnm_two_candidate_law(h0: int, h1: int, t: int) -> float:
    """Exact P(candidate 0) of argmax(h + DLap(t)) with uniform ties (enumerated)."""
    z = np.arange(-60 * t, 60 * t + 1)
    p = _dlap_pmf(z, t)
    p = p / p.sum()
    cdf = np.cumsum(p)  # P(Z1 ≤ z)
    # candidate 0 wins if h0 + z0 > h1 + z1 (z1 < h0 - h1 + z0) or ties with prob 1/2
    idx_lt = np.searchsorted(z, h0 - h1 + z, side="left") - 1
    below = np.where(idx_lt >= 0, cdf[np.clip(idx_lt, 0, None)], 0.0)
    eq_idx = np.searchsorted(z, h0 - h1 + z)
    equal = np.where(eq_idx < z.size, p[np.clip(eq_idx, 0, z.size - 1)], 0.0) * (
        z[np.clip(eq_idx, 0, z.size - 1)] == h0 - h1 + z
    )
    return float(np.sum(p * (below + 0.5 * equal)))


@pytest.mark.parametrize("grid_bits", [0, 2, 40])
def test_report_noisy_max_privacy_ratio_on_two_candidates(grid_bits: int) -> None:
    """Neighbours (0, 0) and (Δ, -Δ) (non-monotone): P(i)/P'(i) ≤ e^ε exactly and empirically."""
    scale, delta = 2.0, 1.0
    eps = 2 * delta / scale
    p = report_noisy_max_parameters(scale=scale, sensitivity=delta, grid_bits=grid_bits)
    assert p.epsilon <= eps
    if p.noise_units < 200:  # exact law on the grid
        h = round(delta / p.grid)
        law = _rnm_two_candidate_law(0, 0, p.noise_units), _rnm_two_candidate_law(h, -h, p.noise_units)
        for a, b in ((law[0], law[1]), (1 - law[0], 1 - law[1])):
            assert max(a / b, b / a) <= math.exp(p.epsilon) * (1 + 1e-9)
    rng = _rng(33 + grid_bits)
    n = 4000
    freq = [
        np.mean([report_noisy_max(rng, s, scale=scale, sensitivity=delta, grid_bits=grid_bits) == 1 for _ in range(n)])
        for s in (np.array([0.0, 0.0]), np.array([delta, -delta]))
    ]
    for a, b in ((freq[0], freq[1]), (1 - freq[0], 1 - freq[1])):
        tol = 5 * math.sqrt(0.25 / n) / min(a, b)
        assert max(a / b, b / a) <= math.exp(eps) * (1 + tol)


@pytest.mark.parametrize("scores", [[np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf], [], [[1.0]]])
def test_report_noisy_max_rejects_bad_scores(scores: list) -> None:
    with pytest.raises(ValueError):
        report_noisy_max(_rng(0), np.array(scores), scale=1.0, sensitivity=1.0)


@settings(max_examples=100, deadline=None)
@given(scale=st.floats(1e-6, 1e6), epsilon=st.floats(1e-6, 1e3))
def test_report_noisy_max_epsilon_bound(scale: float, epsilon: float) -> None:
    delta = epsilon * scale / 2
    p = report_noisy_max_parameters(scale=scale, sensitivity=delta)
    assert Fraction(2 * p.sensitivity_units + 1, p.noise_units) <= 2 * Fraction(delta) / Fraction(scale)
    assert (delta - p.grid) / p.grid < p.sensitivity_units - 1 <= delta / p.grid
    assert p.epsilon >= epsilon * (1 - 1e-3)


# ----------------------------------------------------------------------------- exponential mechanism


def _softmax(scores: np.ndarray, c: float) -> np.ndarray:
    w = np.exp(c * (scores - scores.max()))
    return w / w.sum()


@pytest.mark.parametrize("scores", [[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 4.5, 6.0, -np.inf]])
def test_exponential_mechanism_matches_softmax(scores: list[float]) -> None:
    s = np.array(scores)
    epsilon, delta = 2.0, 1.0
    rng = _rng(40)
    n = 10_000
    counts = np.bincount(
        [exponential_mechanism(rng, s, epsilon=epsilon, sensitivity=delta) for _ in range(n)], minlength=s.size
    )
    finite = np.isfinite(s)
    assert counts[~finite].sum() == 0
    c = exponential_mechanism_parameters(epsilon=epsilon, sensitivity=delta).temperature
    assert c == pytest.approx(epsilon / (2 * delta), rel=1e-5)
    expected = n * _softmax(s[finite], c)
    keep = expected >= 5
    obs, exp_ = counts[finite][keep], expected[keep]
    assert stats.chisquare(obs, exp_ * obs.sum() / exp_.sum()).pvalue > _P_MIN


def test_exponential_mechanism_reaches_the_far_tail() -> None:
    """1000 tail candidates at c·gap = ln(1000/3e-3) ≈ 12.7: total tail mass ≈ 3e-3, observed."""
    epsilon, delta = 2.0, 1.0  # c = 1
    gap = math.log(1000 / 3e-3)
    scores = np.concatenate([[0.0], np.full(1000, -gap)])
    c = exponential_mechanism_parameters(epsilon=epsilon, sensitivity=delta).temperature
    p_tail = 1000 * math.exp(-c * gap) / (1 + 1000 * math.exp(-c * gap))
    rng = _rng(41)
    n = 3000
    hits = sum(exponential_mechanism(rng, scores, epsilon=epsilon, sensitivity=delta) != 0 for _ in range(n))
    law = stats.poisson(n * p_tail)
    assert hits > 0 and law.cdf(hits) > _P_MIN and law.sf(hits - 1) > _P_MIN


def test_exponential_mechanism_keeps_gap_40_weights_exact() -> None:
    """Beyond the Gumbel-on-doubles cut-off (c·gap ≈ 40.3) the weight is still e^-x, x exact.

    P ≈ e^-40 is not observable by sampling; check instead that the exponent handed to the exact
    Bernoulli is c·gap on the 2^-40 grid (whole part 40, fraction ≤ rounding of the score grid)
    and that Bernoulli(e^-x) on such an exponent decomposes into observable factors.
    """
    p = exponential_mechanism_parameters(epsilon=2.0, sensitivity=1.0)
    units = round(40.0 / p.temperature / p.grid)
    x = Fraction(p.weight_numerator * units, 2**40)
    assert abs(float(x) - 40.0) < 1e-5 and x > 0
    # Bernoulli(e^-40) = Bernoulli(e^-10)^4: the γ = 10 factor is tested above; here its chaining
    num = np.full(200_000, 10 * 2**40 // 4, dtype=np.int64)  # γ = 2.5 each, 4 factors = e^-10
    draws = bernoulli_exp_neg(_rng(42), num, denominator_log2=40).reshape(-1, 4).all(axis=1)
    pe = math.exp(-10)
    assert abs(draws.mean() - pe) <= 5 * math.sqrt(pe / draws.size) + 1e-12


def test_exponential_mechanism_masks_and_errors() -> None:
    rng = _rng(43)
    s = np.array([-np.inf, 3.0, -np.inf, 3.0])
    assert {exponential_mechanism(rng, s, epsilon=1.0, sensitivity=1.0) for _ in range(300)} == {1, 3}
    for bad in ([np.nan, 1.0], [np.inf, 0.0], [-np.inf], []):
        with pytest.raises(ValueError):
            exponential_mechanism(rng, np.array(bad), epsilon=1.0, sensitivity=1.0)
    for eps, sens in ((0.0, 1.0), (1.0, 0.0), (math.nan, 1.0), (1.0, math.inf), (2.0**41, 1.0)):
        with pytest.raises(ValueError):
            exponential_mechanism(rng, np.zeros(2), epsilon=eps, sensitivity=sens)


def test_exponential_mechanism_huge_gaps_do_not_overflow() -> None:
    rng = _rng(44)
    s = np.array([1e300, -1e300, 0.0, 1e300 - 1e290])
    assert exponential_mechanism(rng, s, epsilon=1.0, sensitivity=1.0) == 0
    assert report_noisy_max(rng, s, scale=1.0, sensitivity=1.0) == 0


@settings(max_examples=200, deadline=None)
@given(epsilon=st.floats(1e-3, 1e3), sensitivity=st.floats(1e-6, 1e6))
def test_exponential_mechanism_epsilon_bound(epsilon: float, sensitivity: float) -> None:
    p = exponential_mechanism_parameters(epsilon=epsilon, sensitivity=sensitivity)
    used = Fraction(2 * p.weight_numerator * p.sensitivity_units, 2**40)
    assert used <= Fraction(epsilon) and p.epsilon <= epsilon
    assert p.epsilon >= epsilon * (1 - 1e-3)
    assert p.sensitivity_units == math.floor(Fraction(sensitivity) / Fraction(p.grid)) + 1


def test_rare_huge_noise_paths_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """Noise beyond 2^53 (snapped) / 2^60 (RNM) units takes the exact-integer path."""
    from dp.randomness import discrete_samplers as ds

    def fake_parts(rng: np.random.Generator, n: int, t: int) -> tuple[np.ndarray, ...]:
        v = np.zeros(n, dtype=np.int64)
        v[0] = 1 << 40  # |Z| ≈ 2^80 grid units for the first element
        return np.arange(n) % 2 == 1, np.ones(n, dtype=np.int64), v

    monkeypatch.setattr(ds, "_discrete_laplace_parts", fake_parts)
    p = snapped_laplace_parameters(scale=1.0, l1_sensitivity=1.0, dimension=2)
    out = snapped_laplace(_rng(0), np.array([0.5, 0.5]), scale=1.0, l1_sensitivity=1.0)
    assert out[0] == float(Fraction(0.5) + (1 + p.noise_units * (1 << 40)) * Fraction(p.grid))
    assert out[1] == 0.5 - p.grid
    assert report_noisy_max(_rng(0), np.array([-5.0, 5.0]), scale=1.0, sensitivity=1.0) == 0


# ----------------------------------------------------------------------------- speed (printed)


def test_speed_figures() -> None:
    rng = _rng(50)
    t0 = time.perf_counter()
    snapped_laplace(rng, np.zeros(100_000), scale=1.0, l1_sensitivity=1.0)
    t_snap = time.perf_counter() - t0
    timings = {}
    for name, scores in (("peaked", np.concatenate([[0.0], np.full(1999, -50.0)])), ("flat", np.zeros(2000))):
        t0 = time.perf_counter()
        for _ in range(100):
            exponential_mechanism(rng, scores, epsilon=2.0, sensitivity=1.0)
        timings[name] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(100):
        report_noisy_max(rng, rng.normal(size=2000), scale=1.0, sensitivity=1.0)
    t_rnm = time.perf_counter() - t0
    print(
        f"\nsnapped_laplace 1e5 draws: {t_snap * 1e3:.1f} ms; "
        f"exponential_mechanism 100 calls x 2000 candidates: peaked {timings['peaked'] * 1e3:.1f} ms, "
        f"flat {timings['flat'] * 1e3:.1f} ms; report_noisy_max 100 x 2000: {t_rnm * 1e3:.1f} ms"
    )
