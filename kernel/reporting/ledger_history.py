"""Replay a dataset's ledger entries into cumulative ε over time, for plots and tables.

Why replay the entries (and not read the budget row): the entries are the hash-chained source of
truth and the row is a cache (docs/privacy-model.md#ledger); replaying also gives every intermediate state. The
rules are the ledger's own: committed = sum of COMMIT curves; reserved = RESERVE curves of jobs
with no COMMIT/RELEASE yet; ADJUST changes the budget (ε_G, δ_G) from its entry on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel import privacy
from kernel.db.orm import Job, LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger
from kernel.ledger.explanations import explain_entry


@dataclass(frozen=True)
class LedgerPoint:
    """The dataset's state right after one entry (public numbers only)."""

    seq: int
    kind: str
    job_id: str | None
    actor: str
    created_at: dt.datetime
    hash: str
    entry_epsilon: float | None
    committed_epsilon: float
    total_epsilon: float
    budget_epsilon: float
    budget_delta: float
    explanation: str = ""
    """What the entry did, in words (kernel.ledger.explanations): a RELEASE gives budget back."""


def opening_budget(session: Session, budget: PrivacyBudget) -> tuple[float, float]:
    """The budget the dataset was registered with: the first ADJUST's "from" values, else the
    current one (budgets only change through ADJUST entries)."""
    first = session.scalar(
        select(LedgerEntry)
        .where(LedgerEntry.dataset_id == budget.dataset_id, LedgerEntry.kind == ledger.ADJUST)
        .order_by(LedgerEntry.seq)
        .limit(1)
    )
    if first is None:
        return budget.epsilon, budget.delta
    return float(first.details["epsilon_from"]), float(first.details["delta_from"])


def ledger_history(
    entries: Iterable[LedgerEntry],
    *,
    opening_epsilon: float,
    opening_delta: float,
    jobs: Mapping[str, Job] | None = None,
) -> list[LedgerPoint]:
    """One point per entry, in seq order; ε of curves at the δ_G in force at that entry.
    ``entries`` must start at seq 1 (a prefix of the ledger). ``jobs`` (rows by id, see
    :func:`kernel.ledger.explanations.jobs_of`) lets explanations name steps run and how jobs ended."""
    jobs = jobs or {}
    ordered = sorted(entries, key=lambda e: e.seq)
    budget_epsilon, budget_delta = opening_epsilon, opening_delta
    committed: tuple[float, ...] = tuple(ledger.zero_curve())
    open_reservations: dict[str, tuple[float, ...]] = {}
    points: list[LedgerPoint] = []
    for entry in ordered:
        if entry.kind == ledger.ADJUST:
            budget_epsilon = float(entry.details["epsilon_to"])
            budget_delta = float(entry.details["delta_to"])
        elif entry.kind == ledger.RESERVE and entry.job_id and entry.curve:
            open_reservations[entry.job_id] = tuple(entry.curve)
        elif entry.kind == ledger.COMMIT and entry.curve:
            committed = privacy.add_curves(committed, tuple(entry.curve))
            open_reservations.pop(entry.job_id or "", None)
        elif entry.kind == ledger.RELEASE:
            open_reservations.pop(entry.job_id or "", None)
        reserved: tuple[float, ...] = tuple(ledger.zero_curve())
        for curve in open_reservations.values():  # seq order, as the ledger sums them
            reserved = privacy.add_curves(reserved, curve)
        total = privacy.add_curves(committed, reserved)
        points.append(
            LedgerPoint(
                seq=entry.seq,
                kind=entry.kind,
                job_id=entry.job_id,
                actor=entry.actor,
                created_at=entry.created_at,
                hash=entry.hash,
                entry_epsilon=ledger.curve_epsilon(entry.curve, budget_delta) if entry.curve else None,
                committed_epsilon=ledger.curve_epsilon(committed, budget_delta),
                total_epsilon=ledger.curve_epsilon(total, budget_delta),
                budget_epsilon=budget_epsilon,
                budget_delta=budget_delta,
                explanation=explain_entry(
                    kind=entry.kind,
                    job_id=entry.job_id,
                    curve=entry.curve,
                    details=entry.details or {},
                    job=jobs.get(entry.job_id) if entry.job_id else None,
                    dataset_delta=budget_delta,
                ),
            )
        )
    return points
