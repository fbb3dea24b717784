"""A tuning's trials on the worker: how many, which configuration each runs, which one wins.

The number of trials K is drawn here, from the OS's CSPRNG, each time the tuning runs (a retry
draws afresh inside the same reservation), and is stored and logged nowhere: Papernot and
Steinke's guarantee holds for the best trial only while K stays secret. Each trial picks one
configuration of the public pool uniformly at random, independently of the data and of the other
trials, draws its own hold-out split, trains, and releases its DP hold-out metric to this process;
only the best trial's model, configuration and metric leave the worker.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from app import privacy
from app.privacy import TrialDistribution
from app.tuning.planning import METRIC_DIRECTIONS, RebuiltCandidate

__all__ = ["TrialResult", "TuningClaim", "better", "score_of", "trial_count", "tuning_execution"]


@dataclass(frozen=True)
class TuningClaim:
    """An admitted tuning as the worker re-derived it (every candidate checked against the charge)."""

    distribution: TrialDistribution
    candidates: tuple[RebuiltCandidate, ...]
    metric: str

    def draw_candidate(self, rng: secrets.SystemRandom) -> int:
        return rng.randrange(len(self.candidates))


@dataclass(frozen=True)
class TrialResult:
    candidate: int
    metrics: dict[str, Any]
    """The trial's released DP metric (its noisy hold-out value, clamped, with its interval)."""
    score: float


def tuning_execution(device: str) -> dict[str, Any]:
    """The report's execution section of a tuning: the device only (its duration, steps and
    throughput would count its trials)."""
    return {
        "device": device,
        "statement": f"the tuning ran on {device}; its duration, steps and throughput are not shown: they would "
        "tell how many trials it ran",
    }


def trial_count(distribution: TrialDistribution, rng: secrets.SystemRandom) -> int:
    """K, drawn from the OS's CSPRNG (never from anything the client sent)."""
    return privacy.sample_trial_count(distribution, rng=rng)


def score_of(metrics: dict[str, Any], metric: str) -> float:
    value = float(metrics[metric])
    return value if math.isfinite(value) else (-math.inf if METRIC_DIRECTIONS[metric] == "max" else math.inf)


def better(candidate: TrialResult, incumbent: TrialResult | None, metric: str) -> bool:
    """Whether ``candidate`` beats the best so far (ties keep the earlier trial)."""
    if incumbent is None:
        return True
    if METRIC_DIRECTIONS[metric] == "max":
        return candidate.score > incumbent.score
    return candidate.score < incumbent.score
