"""Empirical ε lower bounds from a one-run privacy audit (Steinke, Nasr, Jagielski 2023).

Why this exists: our ε figures are upper bounds proved on paper; an audit checks the code. In
one training run, m canaries are each included independently with probability 1/2; the auditor
looks at what the mechanism released and guesses "in" or "out" for r of them (abstaining on the
rest) and gets v right. If the mechanism is (ε, δ)-DP with respect to each canary, the number of
correct guesses is (up to a δ term) stochastically dominated by Binomial(r, e^ε/(1 + e^ε)) —
ε-DP randomized response is the best any guesser can do. Observing many more correct guesses
than that rejects "(ε, δ)-DP" at significance level 1 − confidence, so

    ε_lb = sup{ε : p_value(ε) < 1 − confidence}

is a valid lower bound: with probability ≥ confidence, the true ε is at least ε_lb. An ε_lb
above the ε a configuration claims is evidence the claim is false
(docs/reproductions.md#one-run-privacy-audit-of-dc-dpsgd).

The p-value is Theorem 5.2 / Algorithm 2 of the paper ("Privacy Auditing with One (1) Training
Run", NeurIPS 2023, arXiv:2305.08846):

    p(ε, δ) = P[Binom(r, q) ≥ v] + 2·m·δ·max_{1≤i≤v} P[v − i ≤ Binom(r, q) < v] / i,
    q = e^ε / (1 + e^ε).

Pure functions, float64 via scipy; torch-free like the rest of the privacy package.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

__all__ = ["one_run_epsilon_lower_bound", "one_run_p_value"]


def _check_counts(*, canaries: int, guesses: int, correct: int) -> None:
    for name, value in (("canaries", canaries), ("guesses", guesses), ("correct", correct)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}")


def one_run_p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """P[≥ `correct` right out of `guesses`] if the mechanism were (ε, δ)-DP (an upper bound)."""
    _check_counts(canaries=canaries, guesses=guesses, correct=correct)
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon}")
    if not 0 <= delta <= 1:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # accuracy of ε-DP randomized response
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # P[Binom ≥ correct]
    slack = 0.0
    if delta > 0 and correct > 0:
        # P[correct − i ≤ Binom < correct] / i for i = 1..correct, maximised over i.
        below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, q)
        slack = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))
    return min(1.0, tail + 2.0 * canaries * delta * slack)


def one_run_epsilon_lower_bound(
    *, canaries: int, guesses: int, correct: int, delta: float, confidence: float = 0.95
) -> float:
    """The largest ε that the observed guesses reject at level 1 − confidence (0 if none).

    Bisection on ε as in the paper's Algorithm 2: the p-value grows with ε (a larger ε allows
    a more accurate guesser, q = e^ε/(1 + e^ε)), so the rejected ε form an interval [0, ε_lb).
    Returned to 1e-9 absolute, rounded DOWN (the safe side for a lower bound).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    level = 1.0 - confidence

    def rejected(epsilon: float) -> bool:
        return (
            one_run_p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=epsilon, delta=delta) < level
        )

    if not rejected(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejected(high):
        low, high = high, 2.0 * high
        if high > 1e3:  # more than any finite number of guesses can certify
            return low
    while high - low > 1e-9:
        middle = 0.5 * (low + high)
        if rejected(middle):
            low = middle
        else:
            high = middle
    return low
