"""How ``training.steps`` enters an algorithm's charge: each definition declares one of these.

The estimate's largest-steps search (kernel/jobs/planning.py) prices a job at more and fewer steps
to find the most that fit the budget; that is sound only where T steps cost exactly the plan's
event composed T times. Each definition states which case it is, read off the ``event_for`` its
plan builds, beside the rest of its privacy plan.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMPOSED", "NOT_CHARGED", "PARALLEL_BLOCKS", "SELF_SCHEDULED_BUDGET_UNITS", "StepsCharge"]


@dataclass(frozen=True)
class StepsCharge:
    """How ``training.steps`` enters an algorithm's charge, for the largest-steps search."""

    composes: bool
    """True when a job of T steps costs exactly ``plan.event_for(σ, T)``: T uses composed, so the
    charge grows with T, and T changes nothing else the charge depends on (σ is relative to the
    sensitivity, which may itself depend on T)."""
    reason: str | None = None
    """Why the search does not apply, when it does not."""


COMPOSED = StepsCharge(composes=True)
"""T releases composed (Poisson-sampled Gaussians, full-batch Gaussians, exponential mechanisms)."""

PARALLEL_BLOCKS = StepsCharge(
    composes=False,
    reason="each row is used in one iteration only (parallel composition over disjoint blocks), "
    "so this algorithm's charge is the same for every number of steps",
)

SELF_SCHEDULED_BUDGET_UNITS = StepsCharge(
    composes=False,
    reason="this algorithm splits its ρ into budget units that it schedules itself; "
    "training.steps does not change its charge",
)

NOT_CHARGED = StepsCharge(
    composes=False,
    reason="this optimizer is not private: it runs on public datasets only, which have no budget to fit",
)
