"""DP evaluation on held-out rows: what is released, its sensitivity and its privacy event.

Torch-free so the API can price it. Add/remove sensitivity: adding one held-out row changes the
number of correct predictions by at most 1, and a sum of squared errors clipped to [0, R] by at
most R. The sum is divided by the public expected hold-out size f·n, never the realised one.

Holding rows out by independent per-row coins means the added row is either in training or in
the hold-out, never both; charging the training event and the evaluation event together (their
composition) is therefore an upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from app.facts import DatasetFacts
from app.privacy import GaussianEvent, LaplaceEvent, PrivacyEvent
from app.schemas.jobs import EvaluationSpec


class InvalidEvaluation(ValueError):
    pass


@dataclass(frozen=True)
class EvaluationPlan:
    holdout_fraction: float
    mechanism: str  # "laplace" | "gaussian"
    metric: str  # "accuracy" | "mse"
    sensitivity: float
    noise_multiplier: float  # Laplace: scale / sensitivity (= 1/ε); Gaussian: std / sensitivity
    expected_holdout_rows: float
    n_rows: int  # the public registered row count the hold-out coins run over

    @property
    def noise_scale(self) -> float:
        """Laplace scale b or Gaussian std of the noise added to the released sum."""
        return self.noise_multiplier * self.sensitivity

    def event(self) -> PrivacyEvent:
        if self.mechanism == "laplace":
            return LaplaceEvent(noise_multiplier=self.noise_multiplier, count=1)
        return GaussianEvent(noise_multiplier=self.noise_multiplier, count=1)

    def normalise(self, *, noisy_sum: float) -> float:
        """The released metric: (sum + noise) / (f·n), post-processing by the public f·n."""
        return noisy_sum / self.expected_holdout_rows

    def describe(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "mechanism": self.mechanism,
            "holdout_fraction": self.holdout_fraction,
            "holdout_selection": "independent per-row coin flips with the job's CSPRNG-seeded generator",
            "sensitivity": self.sensitivity,
            "noise_multiplier": self.noise_multiplier,
            "noise_scale_on_sum": self.noise_scale,
            "normaliser": self.expected_holdout_rows,
        }


def plan_evaluation(spec: EvaluationSpec, facts: DatasetFacts) -> EvaluationPlan:
    if facts.task == "classification":
        if spec.error_clip is not None:
            raise InvalidEvaluation("evaluation.error_clip applies to regression only")
        metric, sensitivity = "accuracy", 1.0
    else:
        if spec.error_clip is None:
            raise InvalidEvaluation("regression needs evaluation.error_clip, a public bound on one squared error")
        metric, sensitivity = "mse", spec.error_clip
    expected = spec.holdout_fraction * facts.n_rows
    if expected < 1:
        raise InvalidEvaluation("the hold-out would be empty: raise holdout_fraction")
    if spec.mechanism == "laplace":
        assert spec.epsilon is not None
        noise_multiplier = 1.0 / spec.epsilon
    else:
        assert spec.noise_multiplier is not None
        noise_multiplier = spec.noise_multiplier
    return EvaluationPlan(
        holdout_fraction=spec.holdout_fraction,
        mechanism=spec.mechanism,
        metric=metric,
        sensitivity=sensitivity,
        noise_multiplier=noise_multiplier,
        expected_holdout_rows=expected,
        n_rows=facts.n_rows,
    )


# ----------------------------------------------------------------------------- released values

CONFIDENCE = 0.95
"""Coverage of the interval reported beside each released metric."""

INTERVAL_COVERS = (
    "the metric on the held-out rows without noise (correct predictions / held-out rows, or the "
    "mean clipped squared error), with probability at least {confidence}: half the miss "
    "probability for the noise, half for the hold-out size, which is Binomial(n, f) and not "
    "released. Computed from public quantities only: the released noisy sum, the noise "
    "distribution, the registered row count n and the hold-out fraction f"
)


def _accuracy_range(plan: EvaluationPlan) -> tuple[float, float]:
    return 0.0, 1.0


def _clipped_mse_range(plan: EvaluationPlan) -> tuple[float, float]:
    return 0.0, plan.sensitivity  # a mean of squared errors each clipped to [0, R]


METRIC_RANGES: dict[str, Callable[[EvaluationPlan], tuple[float, float]]] = {
    "accuracy": _accuracy_range,
    "mse": _clipped_mse_range,
}
"""Where each metric's true value lies; released values are clamped into it."""


def valid_range(plan: EvaluationPlan) -> tuple[float, float]:
    return METRIC_RANGES[plan.metric](plan)


def clamp(value: float, low: float, high: float) -> float:
    """Post-processing of a DP release (free): an accuracy of 1.12 is only noise."""
    if math.isnan(value):
        raise ValueError("a released value is NaN")
    return min(max(value, low), high)


def gaussian_half_width(*, std: float, alpha: float) -> float:
    """w with P(|N(0, std²)| > w) = alpha."""
    return std * NormalDist().inv_cdf(1.0 - alpha / 2.0)


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


def holdout_size_bounds(*, n_rows: int, fraction: float, alpha: float) -> tuple[int, int]:
    """[lo, hi] with P(lo ≤ |H| ≤ hi) ≥ 1 - alpha for |H| ~ Binomial(n, f) (per-row coins).

    Widened by one on each side against floating-point error in the binomial quantiles.
    """
    from scipy.stats import binom  # lazily: only the worker releases metrics; the API never needs it

    low = int(binom.ppf(alpha / 2.0, n_rows, fraction)) - 1
    high = int(binom.isf(alpha / 2.0, n_rows, fraction)) + 1
    return max(0, low), min(n_rows, high)


@dataclass(frozen=True)
class MetricInterval:
    low: float
    high: float
    noise_half_width_on_sum: float
    holdout_rows_low: int
    holdout_rows_high: int


def metric_interval(
    plan: EvaluationPlan,
    *,
    noisy_sum: float,
    noise_half_width_on_sum: float,
    confidence: float = CONFIDENCE,
) -> MetricInterval:
    """An interval for S/|H| (true sum over the realised hold-out size), from public values.

    With probability ≥ 1 - alpha/2 the true sum S lies within noise_half_width_on_sum of the
    noisy sum, and with probability ≥ 1 - alpha/2 the hold-out size |H| lies in
    [holdout_rows_low, holdout_rows_high]; on both events (≥ 1 - alpha, union bound) S/|H| lies
    between the smallest S over the largest |H| and the largest S over the smallest |H|.
    """
    alpha = 1.0 - confidence
    low_range, high_range = valid_range(plan)
    rows_low, rows_high = holdout_size_bounds(n_rows=plan.n_rows, fraction=plan.holdout_fraction, alpha=alpha / 2.0)
    sum_low = max(0.0, noisy_sum - noise_half_width_on_sum)  # a true sum is never negative
    sum_high = max(0.0, noisy_sum + noise_half_width_on_sum)
    low = sum_low / rows_high if rows_high > 0 else low_range
    high = sum_high / rows_low if rows_low > 0 else high_range
    return MetricInterval(
        low=clamp(low, low_range, high_range),
        high=clamp(high, low_range, high_range),
        noise_half_width_on_sum=noise_half_width_on_sum,
        holdout_rows_low=rows_low,
        holdout_rows_high=rows_high,
    )


def released_metric(
    plan: EvaluationPlan,
    *,
    noisy_sum: float,
    noise_half_width_on_sum: float,
    noise_distribution: str,
) -> dict[str, object]:
    """The metric as released: clamped to its valid range, with its noise scale and interval.

    Everything here is a function of the noisy sum and public values (post-processing).
    """
    low_range, high_range = valid_range(plan)
    estimate = plan.normalise(noisy_sum=noisy_sum)
    value = clamp(estimate, low_range, high_range)
    interval = metric_interval(plan, noisy_sum=noisy_sum, noise_half_width_on_sum=noise_half_width_on_sum)
    return {
        plan.metric: value,
        **plan.describe(),
        "valid_range": [low_range, high_range],
        "clamped": value != estimate,
        "noise_distribution": noise_distribution,
        "noise_scale": plan.noise_scale / plan.expected_holdout_rows,
        "interval": {
            "low": interval.low,
            "high": interval.high,
            "confidence": CONFIDENCE,
            "covers": INTERVAL_COVERS.format(confidence=CONFIDENCE),
            "noise_half_width_on_sum": interval.noise_half_width_on_sum,
            "holdout_rows_range": [interval.holdout_rows_low, interval.holdout_rows_high],
        },
    }
