"""Exact discrete noise samplers for Laplace releases, report-noisy-max and the exponential mechanism.

Why: textbook samplers on doubles leak (Mironov 2012: the set of reachable doubles of
`x - b*sign(u)*log(1-2|u|)` depends on x) and Gumbel-max on doubles truncates the Gumbel tail
at ~36.7, giving far candidates probability exactly 0. Here every random decision is an exact
integer event (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for Differential Privacy",
Algorithms 1-2): Bernoulli(a/b) is `rng.integers(0, b) < a`, Bernoulli(exp(-γ)) for rational γ
is CKS Algorithm 1, the discrete Laplace is CKS Algorithm 2. Real inputs are first snapped to a
power-of-two grid γ; the rounding moves each input by ≤ γ/2, which the mechanisms pay for by a
slightly larger noise scale (or smaller temperature), so each one is *exactly* the ε the ledger
charges for its continuous counterpart (pure DP, no δ), assuming only an ideal `rng`.

Exactness notes shared by all functions:
- Snapping a double v to the nearest multiple of γ = 2^k is exact in float64: for |v| < 2^(k+52)
  `rint(v/γ)*γ` involves only power-of-two scalings of normal numbers; a double with
  |v| ≥ 2^(k+52) already is a multiple of γ. Hence γ must be a normal double (grids are kept in
  [2^-1000, 2^1000]).
- Bernoulli(a/(b·K)) with b·K ≥ 2^62 is drawn as Bernoulli(a/b) AND Bernoulli(1/K), so no
  integer product ever reaches 2^62 and no loop has an overflow cut-off.
- `rng` is the caller's `np.random.Generator` (the job's secret-seeded stream in production).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

__all__ = [
    "EmParameters",
    "RnmParameters",
    "SnappedLaplaceParameters",
    "bernoulli_exp_neg",
    "discrete_laplace",
    "exponential_mechanism",
    "exponential_mechanism_parameters",
    "report_noisy_max",
    "report_noisy_max_parameters",
    "snapped_laplace",
    "snapped_laplace_parameters",
]

_PRODUCT_LIMIT = 1 << 62  # every `rng.integers` bound stays below this
_MAX_DENOMINATOR_LOG2 = 50  # bernoulli_exp_neg: 2^k ≤ 2^50
_MAX_NOISE_UNITS = 1 << 50  # discrete Laplace scale t ≤ 2^50
_GRID_BITS = 40  # grid = 2^(floor(log2 scale) - 40): rounding ~2^-40 of scale
_EM_EXPONENT_BITS = 40  # EM log-weights are multiples of 2^-40
_INF_BOUND = 2.0**1000  # ±inf values of snapped_laplace are clamped to ±2^1000
_EXP_RANGE = 960  # scales / sensitivities must lie in [2^-960, 2^960]


# ----------------------------------------------------------------------------- validation


def _positive_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    if not (2.0**-_EXP_RANGE <= value <= 2.0**_EXP_RANGE):
        raise ValueError(f"{name} must lie in [2^-{_EXP_RANGE}, 2^{_EXP_RANGE}], got {value}")
    return value


def _integer(name: str, value: int, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")
    return value


def _floor_log2(x: float) -> int:
    """floor(log2 x) exactly, for a positive finite double."""
    return math.frexp(x)[1] - 1


def _scores_1d(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float scores and the indices of finite ones; -inf = publicly masked, NaN/+inf rejected."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {s.shape}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if np.isposinf(s).any():
        raise ValueError("scores contain +inf (an unbounded score has no finite sensitivity)")
    finite = np.flatnonzero(np.isfinite(s))
    if finite.size == 0:
        raise ValueError("every score is -inf: no candidate can be chosen")
    return s, finite


def _snap(values: np.ndarray, k: int) -> np.ndarray:
    """Nearest multiple of 2^k (ties to even), exactly, for finite doubles (see module notes)."""
    gamma = math.ldexp(1.0, k)
    big = np.abs(values) >= math.ldexp(1.0, k + 52)
    small = np.where(big, 0.0, values)
    return np.where(big, values, np.rint(small / gamma) * gamma)


# ----------------------------------------------------------------------------- Bernoulli


def _bernoulli_exp_neg_unit(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """CKS Algorithm 1: Bernoulli(exp(-num/den)) for 0 ≤ num ≤ den, all elements in lock-step.

    K ← 1; repeat A ~ Bernoulli(γ/K), K += 1 while A = 1; return [final K odd]. P(odd) =
    Σ_k γ^(k-1)/(k-1)!·(1-γ/k)·[k odd] = exp(-γ). Every live element shares the same K, so a
    round is one vectorised draw; Bernoulli(num/(den·K)) is `integers(0, den·K) < num` while
    den·K < 2^62 and Bernoulli(num/den)·Bernoulli(1/K) beyond (never in practice).
    """
    out = np.empty(num.shape[0], dtype=bool)
    live = np.arange(num.shape[0])
    k = 1
    while live.size:
        if den * k < _PRODUCT_LIMIT:
            a = rng.integers(0, den * k, size=live.size) < num[live]
        else:
            a = (rng.integers(0, den, size=live.size) < num[live]) & (rng.integers(0, k, size=live.size) == 0)
        out[live[~a]] = k % 2 == 1
        live = live[a]
        k += 1
    return out


def _e1_run_lengths(rng: np.random.Generator, limit: np.ndarray) -> np.ndarray:
    """min(G_i, limit_i), G_i = number of Bernoulli(e^-1) successes before the first failure.

    P(G ≥ g) = e^-g exactly. Draws come in blocks of 4 per live element (98 % of runs end in
    the first block); draws after a failure or past the limit are simply unused.
    """
    count = np.zeros(limit.shape[0], dtype=np.int64)
    live = np.flatnonzero(limit > 0)
    while live.size:
        ok = _bernoulli_exp_neg_unit(rng, np.ones(4 * live.size, dtype=np.int64), 1).reshape(-1, 4)
        run = np.where(ok.all(axis=1), 4, np.argmin(ok, axis=1))
        count[live] += run
        live = live[(run == 4) & (count[live] < limit[live])]
    capped: np.ndarray = np.minimum(count, limit)
    return capped


def _bernoulli_exp_neg_parts(rng: np.random.Generator, whole: np.ndarray, frac: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-(whole + frac/den))) = Π_{whole} Bernoulli(e^-1) · Bernoulli(e^-(frac/den)).

    The product of `whole` Bernoulli(e^-1) is the event G ≥ whole for the run length G; a run
    stops at its first failure (CKS), so the cost does not grow with `whole`.
    """
    out = _e1_run_lengths(rng, whole) >= whole
    live = np.flatnonzero(out & (frac > 0))
    if live.size:
        out[live] = _bernoulli_exp_neg_unit(rng, frac[live], den)
    return out


def bernoulli_exp_neg(rng: np.random.Generator, numerators: np.ndarray, *, denominator_log2: int) -> np.ndarray:
    """Exact, independent Bernoulli(exp(-γ_i)) with γ_i = numerators_i / 2^k (boolean array).

    γ ≤ 1: CKS Algorithm 1; γ > 1: floor(γ) Bernoulli(e^-1) and one Bernoulli(e^-(γ-floor γ)),
    all must succeed. Bernoulli(a/b) is `rng.integers(0, b) < a` on int64 with b < 2^62, so
    k ≤ 50 (the Algorithm-1 counter K multiplies 2^k; past 2^62 it is split, see module notes).
    """
    k = _integer("denominator_log2", denominator_log2, low=0, high=_MAX_DENOMINATOR_LOG2)
    num = np.asarray(numerators)
    if num.dtype.kind not in "iu":
        raise ValueError(f"numerators must be an integer array, got dtype {num.dtype}")
    if num.size and (num.min() < 0 or num.max() > np.iinfo(np.int64).max):
        raise ValueError("numerators must lie in [0, 2^63 - 1]")
    flat = num.astype(np.int64).ravel()
    out = _bernoulli_exp_neg_parts(rng, flat >> k, flat & ((1 << k) - 1), 1 << k)
    return out.reshape(num.shape)


# ----------------------------------------------------------------------------- discrete Laplace


def _discrete_laplace_parts(rng: np.random.Generator, n: int, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n draws of CKS Algorithm 2 (s = 1) as (negative, U, V) with Z = ±(U + t·V), int64 parts.

    Round: U ~ Uniform{0..t-1} kept with Bernoulli(exp(-U/t)); V = number of Bernoulli(e^-1)
    successes before the first failure; X = U + tV has P(X = x) ∝ e^(-U/t)·e^(-V) = e^(-x/t);
    a fair coin gives the sign and (negative, X = 0) is rejected, so P(Z = z) ∝ e^(-|z|/t).
    Each round proposes ~1.75× the missing count and keeps the first accepted ones in order.
    """
    neg = np.empty(n, dtype=bool)
    u_out = np.empty(n, dtype=np.int64)
    v_out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        m = n - filled
        m = m + m * 3 // 4 + 16  # ~63 % of iid candidates are accepted: 1-2 rounds
        u = rng.integers(0, t, size=m)
        u = u[_bernoulli_exp_neg_unit(rng, u, t)]
        v = _e1_run_lengths(rng, np.full(u.size, np.iinfo(np.int64).max, dtype=np.int64))
        negative = rng.integers(0, 2, size=u.size) == 1
        good = ~(negative & (u == 0) & (v == 0))
        take = min(int(good.sum()), n - filled)  # the first accepted iid candidates, in order
        sel = np.flatnonzero(good)[:take]
        dest = slice(filled, filled + take)
        neg[dest], u_out[dest], v_out[dest] = negative[sel], u[sel], v[sel]
        filled += take
    return neg, u_out, v_out


def discrete_laplace(rng: np.random.Generator, size: int | tuple[int, ...], *, scale: int) -> np.ndarray:
    """Exact discrete Laplace: int64 array with P(z) ∝ exp(-|z|/t), t = `scale` ∈ [1, 2^50].

    CKS Algorithm 2 with s = 1, vectorised by rejection rounds. A draw that does not fit int64
    (V ≳ 2^62/t: probability < exp(-2^12)) raises OverflowError rather than being truncated.
    """
    t = _integer("scale", scale, low=1, high=_MAX_NOISE_UNITS)
    shape = (size,) if isinstance(size, (int, np.integer)) and not isinstance(size, bool) else size
    if not isinstance(shape, tuple) or any(
        isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in shape
    ):
        raise ValueError(f"size must be a non-negative int or tuple of them, got {size!r}")
    n = math.prod(shape)
    neg, u, v = _discrete_laplace_parts(rng, n, t)
    if v.size and v.max() > (np.iinfo(np.int64).max - t) // t:
        raise OverflowError("discrete Laplace draw exceeds int64")
    x = u + t * v
    draws: np.ndarray = np.where(neg, -x, x).reshape(shape)
    return draws


# ----------------------------------------------------------------------------- snapped Laplace


@dataclass(frozen=True)
class SnappedLaplaceParameters:
    """grid γ = 2^k, integer noise scale t (noise = DLap(t)·γ) and the exact ε achieved."""

    grid: float
    noise_units: int
    epsilon: float


def snapped_laplace_parameters(
    *, scale: float, l1_sensitivity: float, dimension: int, grid_bits: int = _GRID_BITS
) -> SnappedLaplaceParameters:
    """γ = 2^(floor(log2 scale) - grid_bits), t = ceil(scale·(Δ + dγ)/(Δγ)), ε = (Δ + dγ)/(tγ).

    Computed with exact rationals, so ε ≤ Δ/scale holds exactly (and after rounding to float).
    """
    b = _positive_finite("scale", scale)
    delta = _positive_finite("l1_sensitivity", l1_sensitivity)
    d = _integer("dimension", dimension, low=0, high=1 << 40)
    bits = _integer("grid_bits", grid_bits, low=0, high=_GRID_BITS)
    k = _floor_log2(b) - bits
    gamma = Fraction(math.ldexp(1.0, k))
    grid_sensitivity = Fraction(delta) + d * gamma
    t = math.ceil(Fraction(b) * grid_sensitivity / (Fraction(delta) * gamma))
    if t > _MAX_NOISE_UNITS:
        raise ValueError(
            f"epsilon = l1_sensitivity/scale = {delta / b:g} is too small for {d} values on the "
            f"grid 2^{k} (needs dimension·grid ≲ 2^{_floor_log2(_MAX_NOISE_UNITS) - bits}·l1_sensitivity)"
        )
    return SnappedLaplaceParameters(float(gamma), t, float(grid_sensitivity / (t * gamma)))


def snapped_laplace(
    rng: np.random.Generator,
    values: np.ndarray,
    *,
    scale: float,
    l1_sensitivity: float,
    grid_bits: int = _GRID_BITS,
) -> np.ndarray:
    """values + Laplace-like noise, exactly (l1_sensitivity/scale)-DP, on the grid γℤ (float64).

    Privacy (d = values.size, Δ = l1_sensitivity, γ, t from `snapped_laplace_parameters`):
    1. n = round(v/γ) moves each coordinate by ≤ γ/2, so on neighbours ‖n - n'‖₁·γ ≤ Δ + dγ.
    2. N = n + Z, Z_i ~ DLap(t) iid: P(N)/P'(N) = exp((‖N-n'‖₁ - ‖N-n‖₁)/t) ≤ exp(‖n-n'‖₁/t)
       ≤ exp((Δ + dγ)/(tγ)) ≤ exp(Δ/scale), because tγ ≥ scale·(Δ + dγ)/Δ.
    3. The output is fl(N·γ), a fixed function of the integer vector N (post-processing): the
       float sum rγ + Zγ of two exact multiples of γ is the correctly rounded (n + Z)γ, exact
       while |n + Z| ≤ 2^53; beyond that it is still the same function of N. So every input
       reaches the same set of outputs (multiples of γ) - no Mironov leak.
    NaN is mapped to 0 and ±inf to ±2^1000 (a multiple of γ). A query with L1 sensitivity Δ
    never yields them on one input but not its neighbour, so this only defines the output for
    an already-bounded query; `grid_bits` < 40 gives coarser grids (tests, small t).
    """
    v = np.asarray(values, dtype=np.float64)
    p = snapped_laplace_parameters(scale=scale, l1_sensitivity=l1_sensitivity, dimension=v.size, grid_bits=grid_bits)
    k = _floor_log2(p.grid)
    flat = np.nan_to_num(v.ravel(), nan=0.0, posinf=_INF_BOUND, neginf=-_INF_BOUND)
    rounded = _snap(flat, k)
    neg, u, w = _discrete_laplace_parts(rng, flat.size, p.noise_units)
    exact = w < (1 << 53) // p.noise_units  # |Z| < 2^53: float-exact
    z = np.where(exact, u + p.noise_units * np.where(exact, w, 0), 0)
    z = np.where(neg, -z, z)
    with np.errstate(over="ignore"):
        out = rounded + z.astype(np.float64) * p.grid
    for i in np.flatnonzero(~exact):  # probability < exp(-2^11) per value: exact rationals
        zi = (int(u[i]) + p.noise_units * int(w[i])) * (-1 if neg[i] else 1)
        out[i] = _fraction_to_float(Fraction(float(rounded[i])) + zi * Fraction(p.grid))
    return out.reshape(v.shape)


def _fraction_to_float(x: Fraction) -> float:
    try:
        return float(x)
    except OverflowError:
        return math.copysign(math.inf, x)


# ----------------------------------------------------------------------------- report-noisy-max


@dataclass(frozen=True)
class RnmParameters:
    """grid γ, per-score sensitivity in grid units δ, noise scale t in grid units, exact ε."""

    grid: float
    sensitivity_units: int
    noise_units: int
    epsilon: float


def report_noisy_max_parameters(*, scale: float, sensitivity: float, grid_bits: int = _GRID_BITS) -> RnmParameters:
    """γ = 2^(floor(log2 scale) - grid_bits), δ = floor(Δ/γ) + 1, t = ceil(scale·(2δ+1)/(2Δ)).

    The discrete mechanism is (2δ+1)/t-DP (see `report_noisy_max`), ≤ 2Δ/scale exactly.
    """
    b = _positive_finite("scale", scale)
    delta = _positive_finite("sensitivity", sensitivity)
    bits = _integer("grid_bits", grid_bits, low=0, high=_GRID_BITS)
    gamma = Fraction(math.ldexp(1.0, _floor_log2(b) - bits))
    units = math.floor(Fraction(delta) / gamma) + 1
    t = math.ceil(Fraction(b) * (2 * units + 1) / (2 * Fraction(delta)))
    if t > _MAX_NOISE_UNITS:
        raise ValueError(f"epsilon = 2·sensitivity/scale = {2 * delta / b:g} is too small for the grid")
    return RnmParameters(float(gamma), units, t, float(Fraction(2 * units + 1, t)))


def report_noisy_max(
    rng: np.random.Generator,
    scores: np.ndarray,
    *,
    scale: float,
    sensitivity: float,
    grid_bits: int = _GRID_BITS,
) -> int:
    """argmax_i (score_i + discrete Laplace noise ≈ Laplace(scale)), exactly (2Δ/scale)-DP.

    The continuous version with Laplace(scale) noise on scores of per-score sensitivity Δ (not
    necessarily monotone) is 2Δ/scale-DP (Dwork-Roth Claim 3.9). Discrete version, with γ, δ, t
    from `report_noisy_max_parameters`:
    - r_i = round(u_i/γ)·γ; h_i = max(r_i, max_j r_j - W), W = 2^52·γ (flooring keeps the
      integers H_i = h_i/γ - max H within int64; it is 1-Lipschitz in r, and a floored score
      needs noise ≥ 2^52·γ to win). |r_i - r'_i| ≤ Δ + γ, so |H_i - H'_i| ≤ δ = floor(Δ/γ) + 1.
    - Output argmax_i H_i + Z_i, Z_i ~ DLap(t) iid, exact ties broken uniformly at random.
    - Fix Z_{-i}, m = max_{j≠i} H_j + Z_j. On D, i is output with probability ≤ P(Z_i ≥ m - H_i);
      on D', m' ≤ m + δ and H'_i ≥ H_i - δ, so i wins outright once Z_i ≥ m - H_i + 2δ + 1 (the
      +1 is the tie). DLap has P(Z ≥ z + s) ≥ e^(-s/t)·P(Z ≥ z) for every z and s ≥ 0 (equality
      for z ≥ 0, and for z < 0 since p(z) ≤ p(0)), so P'(i) ≥ e^(-(2δ+1)/t)·P(i), i.e. the
      mechanism is ε = (2δ+1)/t-DP; t = ceil(scale·(2δ+1)/(2Δ)) makes ε ≤ 2Δ/scale.
    -inf marks a candidate masked on every input (public) and never wins; NaN/+inf: ValueError.
    """
    s, finite = _scores_1d(scores)
    p = report_noisy_max_parameters(scale=scale, sensitivity=sensitivity, grid_bits=grid_bits)
    k = _floor_log2(p.grid)
    gaps = _floored_gaps(s[finite], k)  # max H - H_i ∈ [0, 2^52], int64
    neg, u, v = _discrete_laplace_parts(rng, finite.size, p.noise_units)
    if v.max() <= (1 << 60) // p.noise_units - 1:  # |Z| < 2^60: int64 arithmetic
        z = u + p.noise_units * v
        w = np.where(neg, -z, z) - gaps
        winners = np.flatnonzero(w == w.max())
    else:  # probability < exp(-2^10): exact ints
        w_obj = [
            (-1 if n_ else 1) * (int(a) + p.noise_units * int(b)) - int(g)
            for n_, a, b, g in zip(neg, u, v, gaps, strict=True)
        ]
        best = max(w_obj)
        winners = np.array([i for i, x in enumerate(w_obj) if x == best])
    choice = winners[int(rng.integers(0, winners.size))] if winners.size > 1 else winners[0]
    return int(finite[choice])


def _floored_gaps(finite_scores: np.ndarray, k: int) -> np.ndarray:
    """min(max r - r_i, 2^52·γ)/γ as exact int64 for r = scores snapped to γ = 2^k.

    max r - r_i is a multiple of γ; below 2^53·γ it is representable, so the float difference is
    exact, and above 2^52·γ the (monotone) float difference is ≥ 2^52·γ and gets floored.
    """
    r = _snap(finite_scores, k)
    limit = math.ldexp(1.0, k + 52)
    with np.errstate(over="ignore", invalid="ignore"):
        g = np.minimum(r.max() - r, limit)
    gaps: np.ndarray = np.ldexp(g, -k).astype(np.int64)
    return gaps


# ----------------------------------------------------------------------------- exponential mechanism


@dataclass(frozen=True)
class EmParameters:
    """Scores snapped to grid γ, log-weight per grid unit λ = a/2^40, exact ε; temperature = λ/γ."""

    grid: float
    sensitivity_units: int
    weight_numerator: int
    epsilon: float
    temperature: float


def exponential_mechanism_parameters(*, epsilon: float, sensitivity: float) -> EmParameters:
    """γ = 2^(floor(log2 Δ) - g), δ = floor(Δ/γ) + 1, a = floor(ε·2^39/δ), ε_used = 2aδ/2^40.

    g ≈ (39 + log2 ε)/2 balances the two relative losses in ε: 1/δ ≈ 2^-g from snapping and
    1/a ≈ 2^(g-39)/ε from putting λ on the 2^-40 grid; a < 2^31 keeps a·(gap) exact in int64.
    For ε ≥ 2^-10 the loss is < 2^-13 relative; ε < ~2^-35 or > 2^40 is rejected.
    """
    eps = _positive_finite("epsilon", epsilon)
    delta = _positive_finite("sensitivity", sensitivity)
    if eps > 2.0**40:
        raise ValueError(f"epsilon must be ≤ 2^40, got {eps}")
    e_delta = _floor_log2(delta)
    g = min(max((39 + _floor_log2(eps)) // 2, 4), 60)
    while True:
        gamma = Fraction(math.ldexp(1.0, e_delta - g))
        units = math.floor(Fraction(delta) / gamma) + 1
        a = math.floor(Fraction(eps) * 2 ** (_EM_EXPONENT_BITS - 1) / units)
        if a < 1 << 31:
            break
        g += 1
    if a < 1:
        raise ValueError(f"epsilon = {eps:g} is too small for exact sampling on the 2^-40 grid")
    used = Fraction(2 * a * units, 1 << _EM_EXPONENT_BITS)
    lam = Fraction(a, 1 << _EM_EXPONENT_BITS)
    return EmParameters(float(gamma), units, a, float(used), float(lam / gamma))


def exponential_mechanism(rng: np.random.Generator, scores: np.ndarray, *, epsilon: float, sensitivity: float) -> int:
    """Exact sample of P(i) ∝ exp(c·u_i), c = temperature ≈ ε/(2Δ): ε-DP and ε-bounded-range.

    Construction (γ, δ, a from `exponential_mechanism_parameters`, λ = a/2^40):
    - r_i = round(u_i/γ)·γ, h_i = max(r_i, max_j r_j - W), W = 2^52·γ, H_i = h_i/γ ∈ ℤ.
      Rounding moves a score by ≤ γ/2 and the floor is 1-Lipschitz in r, so |H_i - H'_i| ≤ δ.
    - x_i = λ·(max H - H_i) is an exact multiple of 2^-40 (int64 arithmetic, no rounding);
      P(i) = e^(-x_i)/Σ_j e^(-x_j) = e^(λH_i)/Σ_j e^(λH_j).
    - Privacy loss L(i) = ln P(i)/P'(i) = λ(H_i - H'_i) + ln(Σ_j e^(λH'_j)/Σ_j e^(λH_j)); both
      terms lie in [-λδ, λδ], so |L| ≤ 2λδ (ε-DP) and max_i L - min_i L ≤ 2λδ (ε-bounded range)
      with 2λδ = 2aδ/2^40 ≤ ε by the choice of a. The ledger's RDP min(ε, αε²/8) applies.
    - The floor only touches candidates with c·gap ≥ a·2^12 ≥ 4096 (weight ≤ e^-4096); no
      candidate with a finite score gets probability 0 (unlike Gumbel-max on doubles).
    Sampling: propose i uniformly among finite candidates, accept with exact Bernoulli(e^-x_i);
    the first accepted proposal has law ∝ e^-x_i. Proposals come in batches of ~2·m/Σe^-x
    (expected count m/Σ_j e^-x_j: ~1 for flat scores, up to m for one dominant score).
    -inf marks a publicly masked candidate (never chosen); NaN or +inf raise ValueError.
    """
    s, finite = _scores_1d(scores)
    p = exponential_mechanism_parameters(epsilon=epsilon, sensitivity=sensitivity)
    gaps = _floored_gaps(s[finite], _floor_log2(p.grid))  # ≤ 2^52
    a = p.weight_numerator  # < 2^31
    hi, lo = gaps >> 31, gaps & ((1 << 31) - 1)  # a·gaps = a·hi·2^31 + a·lo
    p_hi, p_lo = a * hi, a * lo  # < 2^52, < 2^62
    rest = (p_hi & 511) * (1 << 31) + p_lo  # < 2^40 + 2^62
    whole = (p_hi >> 9) + (rest >> _EM_EXPONENT_BITS)
    frac = rest & ((1 << _EM_EXPONENT_BITS) - 1)
    m = finite.size
    mass = float(np.exp(-(whole + np.ldexp(frac.astype(np.float64), -_EM_EXPONENT_BITS))).sum())
    batch = int(min(max(2.0 * m / mass, 32.0), 65536.0))
    while True:
        idx = rng.integers(0, m, size=batch)
        accepted = _bernoulli_exp_neg_parts(rng, whole[idx], frac[idx], 1 << _EM_EXPONENT_BITS)
        if accepted.any():
            return int(finite[idx[int(np.argmax(accepted))]])


def snapped_laplace_half_width(*, grid: float, noise_units: int, alpha: float) -> float:
    """w with P(|noise| > w) ≤ alpha for the snapped Laplace mechanism's noise on one value.

    The noise is the snap's rounding (at most γ/2) plus γ·Z with P(Z = z) ∝ exp(-|z|/t). With
    p = exp(-1/t), P(|Z| ≥ k) = 2pᵏ/(1 + p) ≤ alpha once k ≥ t·ln(2/(alpha(1 + p))), so
    |noise| ≤ γ(k - 1) + γ/2 < γ(t·ln(2/(alpha(1 + p))) + 1/2) with probability ≥ 1 - alpha. As
    t grows this tends to the continuous b·ln(1/alpha), b = tγ.
    """
    p = math.exp(-1.0 / noise_units)
    log_term = math.log(2.0 / alpha) - math.log1p(p)
    return grid * (noise_units * log_term + 0.5) * (1.0 + 1e-12)  # float slack on the safe side
