"""A tuning's trials on the worker: how many, which configuration each runs, which one wins.

The number of trials K is drawn by the tuning job's worker, from the OS's CSPRNG, each time the
tuning runs (a retry draws afresh inside the same reservation). Papernot and Steinke's guarantee
holds for the best trial only while K stays secret: it is logged nowhere and lives only in the
service's trial queue while the tuning runs (app/tuning/trial_queue.py, deleted when it settles).
Each trial picks one configuration of the public pool uniformly at random, independently of the
data and of the other trials, draws its own hold-out split, trains, and releases its DP hold-out
metric to the service; only the best trial's model, configuration and metric are released.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app import privacy
from app.privacy import TrialDistribution
from app.tuning.planning import METRIC_DIRECTIONS, RebuiltCandidate

__all__ = ["TrialResult", "TuningClaim", "best_of", "better", "score_of", "trial_count", "tuning_execution"]


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
    seq: int
    """The trial's place in the order of drawing: ties in the metric go to the earlier trial."""
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
    """Whether ``candidate`` beats ``incumbent`` (ties go to the earlier-drawn trial): a total
    order, so every worker agrees on the best whatever order the trials finished in."""
    if incumbent is None:
        return True
    if candidate.score == incumbent.score:
        return candidate.seq < incumbent.seq
    if METRIC_DIRECTIONS[metric] == "max":
        return candidate.score > incumbent.score
    return candidate.score < incumbent.score


def best_of(trials: Iterable[TrialResult], metric: str) -> TrialResult | None:
    best: TrialResult | None = None
    for trial in trials:
        if better(trial, best, metric):
            best = trial
    return best
