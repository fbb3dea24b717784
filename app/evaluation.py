"""DP evaluation on held-out rows: what is released, its sensitivity and its privacy event.

Torch-free so the API can price it. Add/remove sensitivity: adding one held-out row changes the
number of correct predictions by at most 1, and a sum of squared errors clipped to [0, R] by at
most R. The sum is divided by the public expected hold-out size f·n, never the realised one.

Holding rows out by independent per-row coins means the added row is either in training or in
the hold-out, never both; charging the training event and the evaluation event together (their
composition) is therefore an upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass

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
            raise InvalidEvaluation(
                "regression needs evaluation.error_clip, a public bound on one squared error"
            )
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
    )
