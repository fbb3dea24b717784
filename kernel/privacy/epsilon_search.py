"""Inverting an exact privacy profile δ(ε): the smallest ε whose δ is at most the target, and the
δ of an ε, both on the safe side of the profile's float error."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from kernel.privacy.rounding import round_up

LOG_DELTA_MARGIN: Final[float] = 1e-6
"""A root ε is accepted only where the computed log δ(ε) is this far below log δ: it dominates the
float error of the log-space profiles (~1e-9 in log δ even at k = 10^5) by three orders, so the
root finder's tolerance can never land on the invalid side."""


def smallest_epsilon(log_delta_at: Callable[[float], float], *, delta: float, upper: float) -> float:
    """The smallest ε in [0, upper] (to ~1e-12) whose computed log δ(ε) is LOG_DELTA_MARGIN below
    log δ; δ(ε) must be non-increasing. Returns the verified end of the bracket, rounded up."""
    target = math.log(delta) - LOG_DELTA_MARGIN
    if log_delta_at(0.0) <= target:
        return 0.0
    if not log_delta_at(upper) <= target:
        raise ArithmeticError("no ε in range meets δ")
    lo, hi = 0.0, upper
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if log_delta_at(mid) <= target:
            hi = mid
        else:
            lo = mid
    return round_up(hi)


def delta_upper_bound(log_delta: float) -> float:
    """δ from a computed log δ(ε), raised by LOG_DELTA_MARGIN over the float error and capped at 1."""
    if log_delta == -math.inf:
        return 0.0
    return min(1.0, round_up(math.exp(log_delta + LOG_DELTA_MARGIN)))
