"""DP evaluation on held-out rows: what is released, its sensitivity and its privacy event.

Torch-free so the API can price it. Add/remove sensitivity: adding one held-out row changes the
number of correct predictions by at most 1, a sum of squared errors clipped to [0, R] by at most
R, and a sum of per-row mean token losses clipped to [0, R] (language models) by at most R. The
sum is divided by the public expected hold-out size f·n, never the realised one.

Holding rows out by independent per-row coins means the added row is either in training or in
the hold-out, never both; charging the training event and the evaluation event together (their
composition) is therefore an upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from kernel.datasets.facts import DatasetFacts
from kernel.privacy import GaussianEvent, LaplaceEvent, PrivacyEvent
from kernel.schemas.jobs import EvaluationSpec


class InvalidEvaluation(ValueError):
    pass


@dataclass(frozen=True)
class EvaluationPlan:
    holdout_fraction: float
    mechanism: str  # "laplace" | "gaussian"
    metric: str  # "accuracy" | "mse" | "perplexity"
    sensitivity: float
    noise_multiplier: float  # Laplace: scale / sensitivity (= 1/ε); Gaussian: std / sensitivity
    expected_holdout_rows: float
    n_rows: int  # the public registered count the hold-out coins run over (rows, or privacy units)
    sensitivity_source: str | None = None
    """Where a clip bound that the user may leave out came from (None: the user gave it, or there is none)."""
    per_unit: bool = False
    """A privacy unit dataset: the coins are per unit (all its rows on one side) and each held-out
    unit's term is the mean of its rows' terms, so one unit moves the sum by at most the sensitivity."""

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
            "holdout_selection": (
                "independent per-unit coin flips (all of a unit's rows on one side; each held-out unit's term is "
                "the mean over its rows) with the job's CSPRNG-seeded generator"
                if self.per_unit
                else "independent per-row coin flips with the job's CSPRNG-seeded generator"
            ),
            "sensitivity": self.sensitivity,
            **({"sensitivity_source": self.sensitivity_source} if self.sensitivity_source else {}),
            "noise_multiplier": self.noise_multiplier,
            "noise_scale_on_sum": self.noise_scale,
            "normaliser": self.expected_holdout_rows,
        }


@dataclass(frozen=True)
class MetricChoice:
    """What a task's evaluation sums over the held-out rows, and how far one row can move that sum."""

    metric: str
    sensitivity: float
    sensitivity_source: str | None = None


TaskMetric = Callable[[EvaluationSpec, DatasetFacts], MetricChoice]
TASK_METRICS: dict[str, TaskMetric] = {}
"""A dataset's task -> its evaluation metric; each refuses the ``evaluation`` fields it has no use for."""


def register_task_metric(task: str) -> Callable[[TaskMetric], TaskMetric]:
    def decorator(choose: TaskMetric) -> TaskMetric:
        if task in TASK_METRICS:
            raise ValueError(f"task {task!r} already has an evaluation metric")
        TASK_METRICS[task] = choose
        return choose

    return decorator


def _refuse_unused(spec: EvaluationSpec, facts: DatasetFacts, *, fields: dict[str, str]) -> None:
    """``fields``: each evaluation field that must be left out -> the task it applies to."""
    for field, applies_to in fields.items():
        if getattr(spec, field) is not None:
            raise InvalidEvaluation(
                f"evaluation.{field} applies to {applies_to} datasets, and this dataset's task is {facts.task}; "
                "leave it out"
            )


@register_task_metric("classification")
def _accuracy(spec: EvaluationSpec, facts: DatasetFacts) -> MetricChoice:
    _refuse_unused(spec, facts, fields={"error_clip": "regression", "loss_clip": "language-model"})
    return MetricChoice(metric="accuracy", sensitivity=1.0)


@register_task_metric("regression")
def _mse(spec: EvaluationSpec, facts: DatasetFacts) -> MetricChoice:
    _refuse_unused(spec, facts, fields={"loss_clip": "language-model"})
    if spec.error_clip is None:
        raise InvalidEvaluation("regression needs evaluation.error_clip, a public bound on one squared error")
    return MetricChoice(metric="mse", sensitivity=spec.error_clip)


DEFAULT_LOSS_CLIP_SOURCE = "default 2·ln(vocab_size), from the public vocabulary size"


def default_loss_clip(vocab_size: int) -> float:
    """2·ln(V): twice the mean token loss of a model that predicts every token uniformly.

    Public because V is: it is the size of the dataset's tokenizer, which is public (a tokenizer
    fitted to the private text is refused at upload). A model worth evaluating lies below ln V on
    most rows; the factor 2 keeps rows of a model worse than uniform from all sitting on the clip,
    while the noise, which grows with the bound, stays of the order of the losses themselves.
    """
    if vocab_size < 2:
        raise InvalidEvaluation("a vocabulary of fewer than 2 tokens has no token loss to evaluate")
    return 2.0 * math.log(vocab_size)


@register_task_metric("language-model")
def _perplexity(spec: EvaluationSpec, facts: DatasetFacts) -> MetricChoice:
    _refuse_unused(spec, facts, fields={"error_clip": "regression"})
    if spec.loss_clip is not None:
        return MetricChoice(metric="perplexity", sensitivity=spec.loss_clip)
    if facts.vocab_size is None:
        raise InvalidEvaluation("evaluation.loss_clip is needed: this dataset records no vocabulary size")
    return MetricChoice(
        metric="perplexity",
        sensitivity=default_loss_clip(facts.vocab_size),
        sensitivity_source=DEFAULT_LOSS_CLIP_SOURCE,
    )


def plan_evaluation(spec: EvaluationSpec, facts: DatasetFacts) -> EvaluationPlan:
    choose = TASK_METRICS.get(facts.task)
    if choose is None:
        raise InvalidEvaluation(f"no DP evaluation is offered for {facts.task} datasets; leave evaluation out")
    choice = choose(spec, facts)
    expected = spec.holdout_fraction * facts.n_privacy_units
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
        metric=choice.metric,
        sensitivity=choice.sensitivity,
        noise_multiplier=noise_multiplier,
        expected_holdout_rows=expected,
        n_rows=facts.n_privacy_units,
        sensitivity_source=choice.sensitivity_source,
        per_unit=facts.unit_level,
    )


# ----------------------------------------------------------------------------- released values

CONFIDENCE = 0.95
"""Coverage of the interval reported beside each released metric."""

INTERVAL_COVERS = (
    "the metric on the held-out rows without noise (correct predictions / held-out rows, the mean "
    "clipped squared error or the mean clipped token loss), with probability at least {confidence}: half the miss "
    "probability for the noise, half for the hold-out size, which is Binomial(n, f) and not "
    "released. Computed from public quantities only: the released noisy sum, the noise "
    "distribution, the registered row count n and the hold-out fraction f"
)


def _accuracy_range(plan: EvaluationPlan) -> tuple[float, float]:
    return 0.0, 1.0


def _clipped_mse_range(plan: EvaluationPlan) -> tuple[float, float]:
    return 0.0, plan.sensitivity  # a mean of squared errors each clipped to [0, R]


def _clipped_token_loss_range(plan: EvaluationPlan) -> tuple[float, float]:
    return 0.0, plan.sensitivity  # a mean of per-row mean token losses each clipped to [0, R]


METRIC_RANGES: dict[str, Callable[[EvaluationPlan], tuple[float, float]]] = {
    "accuracy": _accuracy_range,
    "mse": _clipped_mse_range,
    "perplexity": _clipped_token_loss_range,
}
"""Where the mean of each metric's per-row terms truly lies; released means are clamped into it
(for perplexity that mean is the mean token loss, whose exp is the perplexity)."""


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


@dataclass(frozen=True)
class ReleasedMean:
    """The released mean of the per-row terms (noisy sum / f·n), clamped, with its interval."""

    value: float
    clamped: bool
    valid_range: tuple[float, float]
    interval: MetricInterval
    noise_scale: float  # of the noise on this mean: on the sum divided by f·n
    noise_distribution: str

    def interval_fields(self) -> dict[str, object]:
        return {
            "low": self.interval.low,
            "high": self.interval.high,
            "confidence": CONFIDENCE,
            "noise_half_width_on_sum": self.interval.noise_half_width_on_sum,
            "holdout_rows_range": [self.interval.holdout_rows_low, self.interval.holdout_rows_high],
        }


MetricView = Callable[[EvaluationPlan, ReleasedMean], dict[str, object]]
METRIC_VIEWS: dict[str, MetricView] = {}
"""A metric -> how its released mean is shown (post-processing only: it sees no private value)."""


def register_metric_view(*metrics: str) -> Callable[[MetricView], MetricView]:
    def decorator(view: MetricView) -> MetricView:
        for metric in metrics:
            if metric in METRIC_VIEWS:
                raise ValueError(f"metric {metric!r} already has a view")
            METRIC_VIEWS[metric] = view
        return view

    return decorator


@register_metric_view("accuracy", "mse")
def _mean_as_is(plan: EvaluationPlan, mean: ReleasedMean) -> dict[str, object]:
    return {
        plan.metric: mean.value,
        **plan.describe(),
        "valid_range": list(mean.valid_range),
        "clamped": mean.clamped,
        "noise_distribution": mean.noise_distribution,
        "noise_scale": mean.noise_scale,
        "interval": {**mean.interval_fields(), "covers": INTERVAL_COVERS.format(confidence=CONFIDENCE)},
    }


PERPLEXITY_INTERVAL_COVERS = (
    "exp of the mean clipped token loss on the held-out rows without noise, with probability at least "
    "{confidence}: the interval of the mean token loss (half the miss probability for the noise, half for "
    "the hold-out size, which is Binomial(n, f) and not released) mapped through exp, which is increasing. "
    "Computed from public quantities only: the released noisy sum, the noise distribution, the "
    "registered row count n and the hold-out fraction f"
)

EMPTY_ROW_NOTE = (
    "a held-out row with no target token (padding only, or a single token) adds a loss of 0 and still counts in f·n"
)


def _exp(value: float) -> float:
    return math.exp(value)  # a mean token loss is at most loss_clip ≤ 100: no overflow


@register_metric_view("perplexity")
def _perplexity_view(plan: EvaluationPlan, mean: ReleasedMean) -> dict[str, object]:
    """Perplexity = exp(mean token loss): the noise is on the summed token loss, so the
    perplexity row carries no additive noise scale; the mean token loss row beside it does."""
    loss_low, loss_high = mean.valid_range
    token_loss: dict[str, object] = {
        "metric": "mean_token_loss",
        "mean_token_loss": mean.value,
        "mechanism": plan.mechanism,
        "valid_range": [loss_low, loss_high],
        "clamped": mean.clamped,
        "noise_scale": mean.noise_scale,
        "interval": {**mean.interval_fields(), "covers": INTERVAL_COVERS.format(confidence=CONFIDENCE)},
    }
    return {
        "perplexity": _exp(mean.value),
        "mean_token_loss": mean.value,
        **plan.describe(),
        "loss_clip": plan.sensitivity,
        "valid_range": [_exp(loss_low), _exp(loss_high)],
        "clamped": mean.clamped,
        "noise_distribution": mean.noise_distribution
        + "; it is added to the summed token loss, and perplexity is exp of the released mean token loss",
        "noise_scale": None,
        "noise_scale_on_mean_token_loss": mean.noise_scale,
        "empty_rows": EMPTY_ROW_NOTE,
        "interval": {
            **mean.interval_fields(),
            "low": _exp(mean.interval.low),
            "high": _exp(mean.interval.high),
            "covers": PERPLEXITY_INTERVAL_COVERS.format(confidence=CONFIDENCE),
        },
        "also_released": [token_loss],
    }


def expected_interval(plan: EvaluationPlan, *, confidence: float = CONFIDENCE) -> dict[str, object]:
    """Before the job runs, from public values only: how wide the released metric's interval will be,
    so that ``evaluation.epsilon`` (or σ) and ``holdout_fraction`` can be sized before anything is
    spent. The noise's half-width is the same whatever the metric turns out to be; the interval also
    holds the hold-out size's spread, so it is shown at the middle of the metric's range (accuracy 0.5,
    half the error clip) or, for perplexity, as the factor the noise alone multiplies it by."""
    tail = (1.0 - confidence) / 2.0  # as the release splits it: half the miss probability for the noise
    if plan.mechanism == "laplace":
        on_sum = plan.noise_scale * math.log(1.0 / tail)  # P(|Laplace(b)| > w) = exp(-w/b)
    else:
        on_sum = gaussian_half_width(std=plan.noise_scale, alpha=tail)
    noise = on_sum / plan.expected_holdout_rows
    advice = "raise evaluation.epsilon (or lower its noise_multiplier) or holdout_fraction to narrow it"
    if plan.metric == "perplexity":
        factor = math.exp(noise)
        return {
            "metric": "perplexity",
            "confidence": confidence,
            "noise_half_width_on_mean_token_loss": noise,
            "perplexity_factor": factor,
            "statement": f"the noise alone moves the mean token loss by up to ±{noise:.3g} nats, so the released "
            f"perplexity's {confidence:.0%} interval spans at least a factor of {factor:.3g} either way of the "
            f"perplexity on the held-out rows (more with the hold-out size's spread); {advice}",
        }
    low_range, high_range = valid_range(plan)
    middle = (low_range + high_range) / 2.0
    interval = metric_interval(
        plan, noisy_sum=middle * plan.expected_holdout_rows, noise_half_width_on_sum=on_sum, confidence=confidence
    )
    return {
        "metric": plan.metric,
        "confidence": confidence,
        "noise_half_width": noise,
        "at": middle,
        "low": interval.low,
        "high": interval.high,
        "width": interval.high - interval.low,
        "holdout_rows_range": [interval.holdout_rows_low, interval.holdout_rows_high],
        "statement": f"if the {plan.metric} on the held-out rows were {middle:.3g}, its released {confidence:.0%} "
        f"interval would be about [{interval.low:.3g}, {interval.high:.3g}] "
        f"(width {interval.high - interval.low:.3g}); "
        f"the noise alone moves the released value by up to ±{noise:.3g}; {advice}",
    }


def released_metric(
    plan: EvaluationPlan,
    *,
    noisy_sum: float,
    noise_half_width_on_sum: float,
    noise_distribution: str,
) -> dict[str, object]:
    """The metric as released: clamped to its valid range, with its noise scale and interval.

    Everything here is a function of the noisy sum and public values (post-processing).
    ``also_released`` (perplexity only) lists further values shown beside the metric, each in the
    same shape (``metric``, its value, ``interval``, ``noise_scale``).
    """
    low_range, high_range = valid_range(plan)
    estimate = plan.normalise(noisy_sum=noisy_sum)
    value = clamp(estimate, low_range, high_range)
    mean = ReleasedMean(
        value=value,
        clamped=value != estimate,
        valid_range=(low_range, high_range),
        interval=metric_interval(plan, noisy_sum=noisy_sum, noise_half_width_on_sum=noise_half_width_on_sum),
        noise_scale=plan.noise_scale / plan.expected_holdout_rows,
        noise_distribution=noise_distribution,
    )
    return METRIC_VIEWS[plan.metric](plan, mean)
