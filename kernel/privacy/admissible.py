"""What still fits a Rényi filter: the most steps at a fixed σ, the least σ at fixed steps, and the
remaining ε after one more job.

The request path answers these for ``POST /v1/jobs/estimate``, so each is a bounded search whose
every probe is one closed-form RDP curve (docs/single-job-epsilon.md): over integers for steps (a
gallop from a linear guess, then a bisection: a few probes, never more than 2·⌈log2(max_steps)⌉
+ 2) and a bisection over log σ for the noise (at most ⌈log2(log(high/low) / log(1 + tolerance))⌉
+ 2 probes). Both assume the charge is monotone: more
steps never cost less (a count-composed event), more noise never costs more (every event family
here). Callers decide where that holds; the answer is then exact for the filter as it stands.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from kernel.privacy.budget_filter import admission_order, remaining_epsilon
from kernel.privacy.curves import add_curves, validate_curve
from kernel.privacy.orders import Curve

SIGMA_RELATIVE_TOLERANCE: Final[float] = 1e-6
"""The σ bisection stops once the admitted and the rejected σ are this close (relative)."""


@dataclass(frozen=True)
class FilterState:
    """A dataset's filter at one moment: what is committed and reserved, and the capacity."""

    committed: Curve
    reserved: Curve
    capacity: Curve

    def admits(self, cost: Sequence[float] | None) -> bool:
        """The ledger's own admission test (some order has room for ``cost``); a cost that could
        not be computed (None: its RDP overflows) is never admitted."""
        return cost is not None and (
            admission_order(committed=self.committed, reserved=self.reserved, cost=cost, capacity=self.capacity)
            is not None
        )

    def remaining_epsilon_after(self, cost: Sequence[float], *, delta: float) -> float | None:
        """``remaining_epsilon`` once ``cost`` is reserved, summed in the ledger's order (reserved
        + cost, then committed + reserved) so the number is the one the ledger will show; None
        when the filter would refuse ``cost``."""
        if not self.admits(cost):
            return None
        reserved_after = add_curves(self.reserved, validate_curve(cost, name="cost"))
        used = add_curves(self.committed, reserved_after)
        return remaining_epsilon(used=used, capacity=self.capacity, delta=delta)


def steps_probe_limit(max_steps: int) -> int:
    """How many costs :func:`largest_admissible_steps` may compute for ``max_steps``: the
    guess, a gallop (⌈log2(max_steps)⌉ + 1 probes at most) and a bisection inside the last stride
    (⌈log2(max_steps)⌉ at most)."""
    return 2 * math.ceil(math.log2(max(max_steps, 2))) + 2


def linear_steps_guess(
    *, cost_without_steps: Sequence[float], cost_at: Sequence[float], steps: int, state: FilterState
) -> int:
    """Where a cost that grows linearly in T (count-composed events: cost(T) = fixed + T·slope,
    fixed = ``cost_without_steps``, known at T = ``steps``) stops fitting: max over orders of the
    room left divided by the slope. Only a starting point: rounding moves the edge by a step or so,
    and :func:`largest_admissible_steps` checks it exactly."""
    fixed = validate_curve(cost_without_steps, name="cost_without_steps")
    known = validate_curve(cost_at, name="cost_at")
    best = 0.0
    for base, total, committed, reserved, capacity in zip(
        fixed, known, state.committed, state.reserved, state.capacity, strict=True
    ):
        slope = (total - base) / max(steps, 1)
        room = capacity - committed - reserved - base
        if slope > 0.0 and room > 0.0:
            best = max(best, room / slope)
    return int(min(best, float(2**62)))


def largest_admissible_steps(
    *,
    cost_of_steps: Callable[[int], Curve | None],
    state: FilterState,
    max_steps: int,
    guess: int | None = None,
) -> int | None:
    """Largest T in [1, max_steps] whose cost the filter admits; None if one step does not fit.

    ``cost_of_steps`` must be non-decreasing in T (None: too large to compute). From ``guess``
    (default: the middle) it gallops outwards with doubling strides until one admitted and one
    refused T bracket the edge, then bisects; the invariant (``fits`` admitted, ``too_many``
    refused) makes the answer admitted and T + 1 refused (or T = max_steps). A good guess costs
    two or three probes; any guess at most :func:`steps_probe_limit`.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")

    def admitted(steps: int) -> bool:
        return state.admits(cost_of_steps(steps))

    start = min(max(guess if guess is not None else (max_steps + 1) // 2, 1), max_steps)
    if admitted(start):
        fits, too_many, stride = start, None, 1
        while too_many is None:
            probe = min(fits + stride, max_steps)
            if probe == fits:  # fits == max_steps
                return max_steps
            if admitted(probe):
                fits, stride = probe, stride * 2
            else:
                too_many = probe
    else:
        fits, too_many, stride = None, start, 1
        while fits is None:
            probe = max(too_many - stride, 1)
            if probe == too_many:  # too_many == 1
                return None
            if admitted(probe):
                fits = probe
            else:
                too_many, stride = probe, stride * 2
    assert fits is not None and too_many is not None  # each gallop exits only with a bracket
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        if admitted(middle):
            fits = middle
        else:
            too_many = middle
    return fits


def sigma_probe_limit(*, low: float, high: float, relative_tolerance: float = SIGMA_RELATIVE_TOLERANCE) -> int:
    """How many costs :func:`smallest_admissible_noise_multiplier` may compute on [low, high]."""
    ratio_bits = math.log2(max(math.log(high / low) / math.log1p(relative_tolerance), 1.0))
    return math.ceil(ratio_bits) + 2


def smallest_admissible_noise_multiplier(
    *,
    cost_of_sigma: Callable[[float], Curve | None],
    state: FilterState,
    low: float,
    high: float,
    relative_tolerance: float = SIGMA_RELATIVE_TOLERANCE,
) -> float | None:
    """Smallest σ in [low, high] the filter admits, always on the admitted side and within
    ``relative_tolerance`` of the boundary; ``low`` if it is admitted, None if ``high`` is not.

    ``cost_of_sigma`` must be non-increasing in σ (None: too large to compute). The bisection is
    in log σ.
    """
    if not 0.0 < low < high or not math.isfinite(high):
        raise ValueError(f"need 0 < low < high < inf, got low={low!r}, high={high!r}")
    if not state.admits(cost_of_sigma(high)):
        return None
    if state.admits(cost_of_sigma(low)):
        return low
    refused, admitted = low, high
    while admitted > refused * (1.0 + relative_tolerance):
        middle = math.sqrt(refused * admitted)
        if not refused < middle < admitted:  # adjacent floats: nothing left to split
            break
        if state.admits(cost_of_sigma(middle)):
            admitted = middle
        else:
            refused = middle
    return admitted
