"""Exponential mechanism, Peeling and the block split of the heavy-tailed family (U6, U7, U9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from algorithms.ht_dpsco.mechanisms import (
    ExactNoise,
    Polytope,
    assign_blocks,
    exponential_mechanism,
    peeling,
    project_l2_ball,
)
from dp.randomness.secure_random import SecureRandom


def _noise(seed: int = 0) -> ExactNoise:
    return ExactNoise(SecureRandom.from_seed(seed))


class CountingNoise(ExactNoise):
    """Records every mechanism call: (kind, number of candidates or values)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__(SecureRandom.from_seed(seed))
        self.calls: list[tuple[str, int]] = []

    def report_noisy_max(self, scores: torch.Tensor, *, scale: float, sensitivity: float) -> int:
        self.calls.append(("select", int(torch.isfinite(scores).sum())))
        return super().report_noisy_max(scores, scale=scale, sensitivity=sensitivity)

    def laplace_release(self, values: torch.Tensor, *, scale: float, sensitivity: float) -> torch.Tensor:
        self.calls.append(("release", values.numel()))
        return super().laplace_release(values, scale=scale, sensitivity=sensitivity)


# ----------------------------------------------------------------------------- U6


def test_exponential_mechanism_matches_softmax_chi_square() -> None:
    scores = torch.tensor([0.0, 0.3, -0.2, 0.9], dtype=torch.float64)
    eps, sens, draws = 2.0, 0.5, 4000
    noise = _noise(1)
    logits = scores * eps / (2 * sens)
    picks = [exponential_mechanism(scores, epsilon=eps, sensitivity=sens, noise=noise) for _ in range(draws)]
    expected = torch.softmax(logits, 0).numpy() * draws
    assert stats.chisquare(np.bincount(picks, minlength=4), expected).pvalue > 1e-3


def test_limits_and_no_overflow() -> None:
    scores = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64) * 1e6
    noise = _noise(2)
    assert all(exponential_mechanism(scores, epsilon=1e6, sensitivity=1.0, noise=noise) == 1 for _ in range(50))
    picks = [exponential_mechanism(scores / 1e6, epsilon=1e-9, sensitivity=1.0, noise=noise) for _ in range(3000)]
    assert stats.chisquare(np.bincount(picks, minlength=3)).pvalue > 1e-3
    assert exponential_mechanism(scores, epsilon=1.0, sensitivity=1e-3, noise=noise) == 1  # logits ~1e9, finite


def test_laplace_noisy_max_selection_is_the_report_noisy_max_of_the_scores() -> None:
    scores = torch.tensor([0.0, 5.0, 1.0], dtype=torch.float64)
    noise = _noise(3)
    picks = [
        exponential_mechanism(scores, epsilon=20.0, sensitivity=0.1, noise=noise, selection="laplace-noisy-max")
        for _ in range(200)
    ]
    assert picks.count(1) >= 199  # noise scale 2Δ/ε = 0.01 against a gap of 4


def test_exact_privacy_ratio_of_one_fw_selection() -> None:
    """For neighbouring gradient estimates (ℓ∞ distance ≤ Δ/r), log P(v|D) − log P(v|D′) ≤ ε for every vertex."""
    ball = Polytope("l1_ball", 1.5, 6)
    rng = np.random.default_rng(3)
    eps, delta_score = 0.8, 0.2
    for _ in range(200):
        g = torch.from_numpy(rng.normal(size=6))
        g_prime = g + torch.from_numpy(rng.uniform(-1, 1, size=6)) * delta_score / ball.radius
        log_p = torch.log_softmax(ball.scores(g) * eps / (2 * delta_score), 0)
        log_q = torch.log_softmax(ball.scores(g_prime) * eps / (2 * delta_score), 0)
        assert float((log_p - log_q).abs().max()) <= eps + 1e-12


def test_polytope_vertices_and_scores() -> None:
    ball, simplex = Polytope("l1_ball", 2.0, 3), Polytope("simplex", 2.0, 3)
    g = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    for polytope in (ball, simplex):
        vertices = torch.stack([polytope.vertex(j, torch.float64, g.device) for j in range(polytope.n_vertices)])
        assert torch.allclose(polytope.scores(g), -(vertices @ g))
    assert float(simplex.start(torch.float64, g.device).sum()) == pytest.approx(2.0)


# ----------------------------------------------------------------------------- U7


def test_peeling_without_noise_is_the_top_s_by_magnitude() -> None:
    v = torch.tensor([0.1, -5.0, 3.0, 0.0, -4.0, 2.0], dtype=torch.float64)
    out = peeling(v, sparsity=3, scale=1e-12, sensitivity=1e-12, noise=_noise())
    assert set(torch.nonzero(out).flatten().tolist()) == {1, 2, 4}
    assert torch.allclose(out[[1, 2, 4]], v[[1, 2, 4]], atol=1e-9)


def test_peeling_has_exactly_s_distinct_non_zeros() -> None:
    noise = _noise(4)
    for _ in range(50):
        out = peeling(torch.zeros(30, dtype=torch.float64), sparsity=7, scale=1.0, sensitivity=1.0, noise=noise)
        assert int((out != 0).sum()) == 7


def test_release_noise_is_fresh_mean_absolute_value_is_b() -> None:
    """v = 0, s = 10, 300 repetitions (d = 200 instead of 10⁴, to keep CI fast; |Laplace(b)| has
    standard deviation b, so over 3,000 values the SE is 1.8%): E|released| = b within 10% (5.5 SE).
    Reusing the selection noise would bias the released values towards the noise maxima (≈ b·ln d,
    5.3·b at this d), fifty times that tolerance."""
    noise, b = _noise(5), 0.7
    released = []
    for _ in range(300):
        out = peeling(torch.zeros(200, dtype=torch.float64), sparsity=10, scale=b, sensitivity=0.35, noise=noise)
        released.append(out[out != 0])
    mean_abs = float(torch.cat(released).abs().mean())
    assert mean_abs == pytest.approx(b, rel=0.10)


def test_peeling_makes_s_fresh_selections_then_one_release_of_s_values() -> None:
    """U7e: fresh noise per round. Round k selects among the d - k unchosen coordinates;
    the release draws new noise for exactly the s chosen ones."""
    noise = CountingNoise()
    peeling(torch.ones(40, dtype=torch.float64), sparsity=6, scale=0.1, sensitivity=0.05, noise=noise)
    assert noise.calls == [("select", 40 - k) for k in range(6)] + [("release", 6)]


def test_laplace_release_has_the_right_law_and_lies_on_one_grid() -> None:
    """KS against Laplace(b); every output, for two different true values, is a multiple of one
    power of two (Mironov's attack needs the reachable outputs to depend on the true value)."""
    noise = _noise(6)
    draws = noise.laplace_release(torch.zeros(200_000, dtype=torch.float64), scale=2.5, sensitivity=1.0).numpy()
    assert stats.kstest(draws, stats.laplace(scale=2.5).cdf).pvalue > 1e-3
    shifted = noise.laplace_release(
        torch.full((1000,), 1.0 / 3.0, dtype=torch.float64), scale=2.5, sensitivity=1.0
    ).numpy()
    grid = 2.0 ** (math.floor(math.log2(2.5)) - 40)
    for values in (draws[:1000], shifted):
        assert np.all(np.mod(values, grid) == 0.0)


def test_float_samplers_are_gone_from_the_mechanisms() -> None:
    """The old inverse-CDF Laplace and Gumbel draws on doubles are no longer reachable."""
    import algorithms.ht_dpsco.mechanisms as mechanisms

    assert not hasattr(mechanisms, "GeneratorNoise")
    with pytest.raises(TypeError):
        ExactNoise(torch.Generator())  # type: ignore[arg-type]


def test_projection_keeps_support() -> None:
    w = torch.tensor([0.0, 3.0, 0.0, -4.0], dtype=torch.float64)
    projected = project_l2_ball(w, 1.0)
    assert float(torch.linalg.vector_norm(projected)) == pytest.approx(1.0)
    assert torch.equal(projected != 0, w != 0)
    assert torch.equal(project_l2_ball(w / 10, 1.0), w / 10)


# ----------------------------------------------------------------------------- block split


def test_block_assignment_is_per_row_and_stable_when_a_row_is_added() -> None:
    """Adding a row (at the end) keeps every other row's block: the first n draws are identical."""
    first = assign_blocks(1000, 7, SecureRandom.from_seed(9))
    second = assign_blocks(1001, 7, SecureRandom.from_seed(9))
    assert torch.equal(first, second[:1000])
    counts = torch.bincount(first, minlength=7)
    assert int(counts.sum()) == 1000 and int(counts.min()) > 100
