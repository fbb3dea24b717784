"""A job's effect on its dataset's budget: before the job, its charge, after it.

Why "before" is taken at commit time and not at admission: between a job's admission and its end
other jobs may commit, be admitted or be released. Comparing the budget at admission with the
budget after the commit would attribute their spending to this job. Taking the ledger as it stood
just before this job's COMMIT, with this job's own reservation removed, puts everything else in
both columns, so the change from "before" to "after" is exactly this job's charge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.db.orm import LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger

BEFORE_DEFINITION = (
    "The dataset's budget just before this job's COMMIT (ledger entry #{before_seq}), without this "
    "job: everything other jobs had committed by then, and their reservations still open then. "
    "Jobs that committed or were admitted after this job was admitted are counted here and in "
    "'after' alike, so the difference between the two is this job's charge alone (the remaining "
    "ε shown at admission may differ: other jobs have committed, been admitted or released since)."
)
AFTER_DEFINITION = (
    "Right after this job's COMMIT and the RELEASE of the unused part of its reservation, if any "
    "(ledger entry #{after_seq})."
)


def budget_without_job(
    budget: PrivacyBudget, *, committed_before: Sequence[float], commit_entry: LedgerEntry
) -> dict[str, Any]:
    """:func:`kernel.ledger.operations.budget_summary` of the ledger just before ``commit_entry``, without the job.

    Call right after :func:`kernel.ledger.operations.commit`: ``budget.reserved`` then holds the other jobs' open
    reservations only, and ``committed_before`` is ``budget.committed`` copied before the commit.
    """
    state = PrivacyBudget(  # transient, never added to a session
        dataset_id=budget.dataset_id,
        epsilon=budget.epsilon,
        delta=budget.delta,
        orders_version=budget.orders_version,
        committed=list(committed_before),
        reserved=list(budget.reserved),
        entry_count=commit_entry.seq - 1,
        last_hash=commit_entry.prev_hash,
    )
    return ledger.budget_summary(state)


def job_charge(
    *,
    committed_epsilon: float,
    reserved_epsilon: float,
    curve: Sequence[float],
    orders: Sequence[float],
    orders_version: str,
    steps_run: int,
    steps_planned: int,
    commit_entry: LedgerEntry,
) -> dict[str, Any]:
    """What the job spent: its COMMIT's ε and curve, beside what it had reserved."""
    return {
        "epsilon_committed": committed_epsilon,
        "epsilon_reserved": reserved_epsilon,
        "steps_run": steps_run,
        "steps_planned": steps_planned,
        "rest_of_reservation_released": steps_run < steps_planned or committed_epsilon < reserved_epsilon,
        "rdp_curve": {"orders": list(orders), "values": list(curve), "orders_version": orders_version},
        "commit_entry_seq": commit_entry.seq,
        "definition": (
            "epsilon_committed is the ledger ε (at the job's δ) of the curve this job's COMMIT "
            "added to the dataset's committed total; epsilon_reserved is what it held while it "
            "ran. Any difference went back to the budget in a RELEASE entry."
        ),
    }
