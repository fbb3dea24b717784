"""Which of a tuning's trials is released: the best released metric, ties to the earliest drawn.

A total order on (metric, order of drawing), so whoever closes the tuning (the worker that ran its
last slot, or the reconciler) picks the same trial whatever order the trials finished in. A trial
stopped at its time limit released nothing and takes no part (kernel/tuning/trial_queue.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernel.tuning.planning import METRIC_DIRECTIONS

__all__ = ["TrialResult", "best_of", "better", "score_of"]


@dataclass(frozen=True)
class TrialResult:
    seq: int
    """The trial's place in the order of drawing: ties in the metric go to the earlier trial."""
    candidate: int
    metrics: dict[str, Any]
    """The trial's released DP metric (its noisy hold-out value, clamped, with its interval)."""
    score: float


def score_of(metrics: dict[str, Any], metric: str) -> float:
    value = float(metrics[metric])
    return value if math.isfinite(value) else (-math.inf if METRIC_DIRECTIONS[metric] == "max" else math.inf)


def better(candidate: TrialResult, incumbent: TrialResult | None, metric: str) -> bool:
    """Whether ``candidate`` beats ``incumbent`` (ties go to the earlier-drawn trial)."""
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
