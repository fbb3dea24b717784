"""Noise calibration: the smallest noise multiplier whose job the filter admits on its own.

The target is expressed in the ledger's own terms (docs/privacy-model.md#ledger): sigma is admitted iff the
job's RDP curve fits under ``capacity_curve(target_epsilon, delta)`` at some order on a fresh
ledger. So a dataset with budget eps_G admits exactly one job calibrated to eps_G, and the
number a user asks for is the number the ledger will charge. RDP is decreasing in sigma, so
admission is monotone and a bisection in log(sigma) finds the boundary.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from kernel.privacy.budget_filter import admission_order
from kernel.privacy.conversion import capacity_curve, validate_delta, validate_epsilon
from kernel.privacy.curves import zero_curve
from kernel.privacy.errors import CalibrationError, PrivacyEventError
from kernel.privacy.events import PrivacyEvent
from kernel.privacy.orders import Curve
from kernel.privacy.rdp import rdp_curve

MAX_NOISE_MULTIPLIER: Final[float] = 1e6
MIN_NOISE_MULTIPLIER: Final[float] = 1e-4
RELATIVE_TOLERANCE: Final[float] = 1e-6
_BRACKET_STEP: Final[float] = 4.0


def calibrate_noise_multiplier(
    build_event: Callable[[float], PrivacyEvent],
    *,
    target_epsilon: float,
    delta: float,
    lower: float = 0.05,
    upper: float = 50.0,
) -> float:
    """Smallest sigma (within relative 1e-6, always on the admitted side) whose event fits alone.

    ``lower``/``upper`` are only the starting bracket; it is widened as needed within
    [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]. Raises CalibrationError when even
    MAX_NOISE_MULTIPLIER is not admitted, when MIN_NOISE_MULTIPLIER already is (a target so
    loose that there is no meaningful boundary), or when an input is invalid.
    """
    try:
        capacity = capacity_curve(validate_epsilon(target_epsilon), validate_delta(delta))
    except PrivacyEventError as exc:
        raise CalibrationError(str(exc)) from exc
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise CalibrationError(f"{name} must be a finite positive number, got {value!r}")
    if lower >= upper:
        raise CalibrationError(f"lower ({lower}) must be below upper ({upper})")

    def admitted(sigma: float) -> bool:
        return _fits_alone(build_event, sigma=sigma, capacity=capacity)

    hi = min(max(float(upper), MIN_NOISE_MULTIPLIER), MAX_NOISE_MULTIPLIER)
    while not admitted(hi):
        if hi >= MAX_NOISE_MULTIPLIER:
            raise CalibrationError(
                f"target epsilon {target_epsilon} at delta {delta} cannot be met "
                f"with a noise multiplier <= {MAX_NOISE_MULTIPLIER:g}"
            )
        hi = min(hi * _BRACKET_STEP, MAX_NOISE_MULTIPLIER)
    lo = min(max(float(lower), MIN_NOISE_MULTIPLIER), hi)
    while lo >= hi or admitted(lo):
        if lo <= MIN_NOISE_MULTIPLIER:
            raise CalibrationError(
                f"target epsilon {target_epsilon} is so loose that "
                f"noise multiplier {MIN_NOISE_MULTIPLIER:g} already meets it"
            )
        hi = min(hi, lo)
        lo = max(lo / _BRACKET_STEP, MIN_NOISE_MULTIPLIER)
    # Invariant: lo is rejected, hi is admitted.
    while hi > lo * (1.0 + RELATIVE_TOLERANCE):
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:
            break
        if admitted(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _fits_alone(build_event: Callable[[float], PrivacyEvent], *, sigma: float, capacity: Curve) -> bool:
    """Would the event built for sigma be admitted on an empty ledger with this capacity?"""
    try:
        cost = rdp_curve(build_event(sigma))
    except PrivacyEventError as exc:
        raise CalibrationError(f"cannot build a valid event for noise multiplier {sigma:g}: {exc}") from exc
    zeros = zero_curve()
    return admission_order(committed=zeros, reserved=zeros, cost=cost, capacity=capacity) is not None
