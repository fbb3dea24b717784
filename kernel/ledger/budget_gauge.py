"""The dashboard's budget bar, drawn so that it agrees with "remaining ε".

Why not committed ε / budget ε: ε does not add up under Rényi DP. A 3.0 budget with 2.588
committed looked 86% full while a new job could still get 1.362 (45% of it). What a person reads
a gauge for is what is left for the next job, and that is ``remaining_epsilon``: the largest
single job the Rényi filter admits now. So the bar is split in the units of that question:

- free: remaining ε / budget ε (what a new job can get now);
- reserved: what open reservations (queued and running jobs) hold back from a new job on top of
  the committed spend, i.e. (remaining if they were released − remaining) / budget ε;
- committed: the rest, 1 − remaining-if-released / budget ε.

Each share is "used, as a share of what a new job could have had on a fresh budget".
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel import privacy
from kernel.db.orm import PrivacyBudget
from kernel.ledger import operations as ledger

__all__ = ["BudgetGauge", "budget_gauge"]


@dataclass(frozen=True)
class BudgetGauge:
    """Bar widths in percent (they add up to 100) and the two ε they are drawn from."""

    committed_percent: float
    reserved_percent: float
    free_percent: float
    remaining_epsilon: float
    remaining_if_released_epsilon: float

    @property
    def used_percent(self) -> float:
        return self.committed_percent + self.reserved_percent


def _share(part: float, whole: float) -> float:
    return 0.0 if whole <= 0 else max(0.0, min(100.0, 100.0 * part / whole))


def budget_gauge(budget: PrivacyBudget) -> BudgetGauge:
    """The bar of one dataset's budget; ``remaining_epsilon`` is exactly the ledger's."""
    capacity = ledger.capacity(budget.epsilon, budget.delta)
    remaining = ledger.remaining_epsilon(budget)
    if_released = privacy.remaining_epsilon(
        used=tuple(budget.committed), capacity=capacity, delta=budget.delta, budget_epsilon=budget.epsilon
    )
    if_released = max(if_released, remaining)  # releasing a reservation never shrinks what is left
    free = _share(remaining, budget.epsilon)
    committed = 100.0 - _share(if_released, budget.epsilon)
    return BudgetGauge(
        committed_percent=committed,
        reserved_percent=max(0.0, 100.0 - committed - free),
        free_percent=free,
        remaining_epsilon=remaining,
        remaining_if_released_epsilon=if_released,
    )
