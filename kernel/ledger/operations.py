"""The per-dataset privacy ledger: admission, reservation, touch, commit, release.

Every function runs inside the caller's transaction, after :func:`lock_budget` has locked the
dataset's budget row (``SELECT … FOR UPDATE`` on PostgreSQL; the whole transaction is
``BEGIN IMMEDIATE`` on SQLite). Entries are append-only and hash-chained; the totals on the budget
row are a cache of what the entries and the open jobs imply (docs/privacy-model.md §7). Which
entry a job's transition writes is decided one level up, in kernel.jobs.lifecycle.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel import privacy
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget, utcnow
from privtrain_common.directed_rounding import format_remaining

RESERVE, TOUCH, COMMIT, RELEASE, ADJUST = "RESERVE", "TOUCH", "COMMIT", "RELEASE", "ADJUST"
ENTRY_KINDS = (RESERVE, TOUCH, COMMIT, RELEASE, ADJUST)


class InsufficientBudget(Exception):
    """The filter rejected a job; nothing was written."""

    def __init__(self, remaining_epsilon: float) -> None:
        super().__init__("insufficient privacy budget")
        self.remaining_epsilon = remaining_epsilon


class LedgerStateError(RuntimeError):
    """A lifecycle transition that the job's ledger history does not allow."""


def zero_curve() -> list[float]:
    return [0.0] * len(privacy.ORDERS)


def genesis_hash(dataset_id: str, *, epsilon: float, delta: float, orders_version: str) -> str:
    """The chain's anchor commits to the opening budget, so editing the budget row is detected."""
    anchor = json.dumps(
        {"dataset_id": dataset_id, "epsilon": epsilon, "delta": delta, "orders_version": orders_version},
        sort_keys=True,
    )
    return hashlib.sha256(f"privtrain-ledger-genesis:{anchor}".encode()).hexdigest()


@lru_cache(maxsize=256)
def capacity(epsilon: float, delta: float) -> tuple[float, ...]:
    return privacy.capacity_curve(epsilon, delta)


def _timestamp(value: dt.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(timespec="microseconds")


def entry_hash(entry: LedgerEntry) -> str:
    """SHA-256 over the entry's canonical JSON content and the previous entry's hash."""
    content = {
        "dataset_id": entry.dataset_id,
        "seq": entry.seq,
        "kind": entry.kind,
        "job_id": entry.job_id,
        "event": entry.event,
        "curve": entry.curve,
        "orders_version": entry.orders_version,
        "accountant": entry.accountant,
        "accountant_version": entry.accountant_version,
        "actor": entry.actor,
        "details": entry.details,
        "created_at": _timestamp(entry.created_at),
        "prev_hash": entry.prev_hash,
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def open_budget(session: Session, *, dataset: Dataset, epsilon: float, delta: float) -> PrivacyBudget:
    budget = PrivacyBudget(
        dataset_id=dataset.id,
        epsilon=epsilon,
        delta=delta,
        orders_version=privacy.ORDERS_VERSION,
        committed=zero_curve(),
        reserved=zero_curve(),
        entry_count=0,
        last_hash=genesis_hash(dataset.id, epsilon=epsilon, delta=delta, orders_version=privacy.ORDERS_VERSION),
    )
    session.add(budget)
    return budget


def lock_budget(session: Session, dataset_id: str) -> PrivacyBudget:
    budget = session.scalar(select(PrivacyBudget).where(PrivacyBudget.dataset_id == dataset_id).with_for_update())
    if budget is None:
        raise LedgerStateError(f"no budget row for dataset {dataset_id}")
    return budget


def _append(
    session: Session,
    budget: PrivacyBudget,
    *,
    kind: str,
    job_id: str | None,
    event: dict[str, Any] | None,
    curve: list[float] | None,
    actor: str,
    details: dict[str, Any] | None = None,
) -> LedgerEntry:
    entry = LedgerEntry(
        dataset_id=budget.dataset_id,
        seq=budget.entry_count + 1,
        kind=kind,
        job_id=job_id,
        event=event,
        curve=curve,
        orders_version=privacy.ORDERS_VERSION,
        accountant=privacy.ACCOUNTANT_NAME,
        accountant_version=privacy.ACCOUNTANT_VERSION,
        actor=actor,
        details=details or {},
        created_at=utcnow(),
        prev_hash=budget.last_hash,
    )
    entry.hash = entry_hash(entry)
    session.add(entry)
    budget.entry_count = entry.seq
    budget.last_hash = entry.hash
    budget.updated_at = entry.created_at
    return entry


@dataclass(frozen=True)
class Admission:
    witness_order: float
    entry: LedgerEntry


def check_admissible(budget: PrivacyBudget, cost: list[float] | tuple[float, ...]) -> int | None:
    """Index of the witness order if the filter admits ``cost`` now, else None (no writes)."""
    return privacy.admission_order(
        committed=tuple(budget.committed),
        reserved=tuple(budget.reserved),
        cost=tuple(cost),
        capacity=capacity(budget.epsilon, budget.delta),
    )


def remaining_epsilon(budget: PrivacyBudget) -> float:
    """What a new job can still get now (exactly ε_G on a budget nothing is committed or reserved on)."""
    used = privacy.add_curves(tuple(budget.committed), tuple(budget.reserved))
    return privacy.remaining_epsilon(
        used=used, capacity=capacity(budget.epsilon, budget.delta), delta=budget.delta, budget_epsilon=budget.epsilon
    )


def reserve(session: Session, budget: PrivacyBudget, *, job: Job, actor: str) -> Admission:
    """Admit a job through the Rényi filter and reserve its worst-case curve."""
    witness = check_admissible(budget, job.reserved_curve)
    if witness is None:
        raise InsufficientBudget(remaining_epsilon(budget))
    checked_against = {"committed": list(budget.committed), "reserved": list(budget.reserved)}
    budget.reserved = list(privacy.add_curves(tuple(budget.reserved), tuple(job.reserved_curve)))
    entry = _append(
        session,
        budget,
        kind=RESERVE,
        job_id=job.id,
        event=job.event,
        curve=list(job.reserved_curve),
        actor=actor,
        details={"witness_order": privacy.ORDERS[witness], "admitted_against": checked_against},
    )
    return Admission(witness_order=privacy.ORDERS[witness], entry=entry)


def _reserved_of_other_open_jobs(session: Session, dataset_id: str, settling_job_id: str) -> list[float]:
    """Reserved total rebuilt from the open reservations but one, read from the hashed entries.

    An open reservation is a RESERVE entry whose job has no COMMIT or RELEASE yet. Rebuilding
    instead of subtracting keeps rounding residue from accumulating (nothing open: exactly zero),
    and reading entries rather than the jobs table means an edited job row cannot free budget.
    """
    settled = select(LedgerEntry.job_id).where(
        LedgerEntry.dataset_id == dataset_id, LedgerEntry.kind.in_((COMMIT, RELEASE))
    )
    curves = session.scalars(
        select(LedgerEntry.curve)
        .where(
            LedgerEntry.dataset_id == dataset_id,
            LedgerEntry.kind == RESERVE,
            LedgerEntry.job_id != settling_job_id,
            LedgerEntry.job_id.not_in(settled),
        )
        .order_by(LedgerEntry.seq)
    )
    total: tuple[float, ...] = tuple(zero_curve())
    for curve in curves:
        if curve is None:  # reserve() always records one
            raise LedgerStateError(f"a RESERVE entry of dataset {dataset_id} has no curve")
        total = privacy.add_curves(total, tuple(curve))
    return list(total)


def reservation_curve(session: Session, job_id: str) -> tuple[float, ...]:
    """The reserved curve as the RESERVE entry recorded it (not the editable jobs row)."""
    curve = session.scalar(select(LedgerEntry.curve).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == RESERVE))
    if curve is None:
        raise LedgerStateError(f"job {job_id} has no reservation")
    return tuple(curve)


def _job_kinds(session: Session, job_id: str) -> list[str]:
    return list(session.scalars(select(LedgerEntry.kind).where(LedgerEntry.job_id == job_id).order_by(LedgerEntry.seq)))


def _require_open_reservation(session: Session, job: Job) -> list[str]:
    kinds = _job_kinds(session, job.id)
    if RESERVE not in kinds:
        raise LedgerStateError(f"job {job.id} has no reservation")
    if COMMIT in kinds or RELEASE in kinds:
        raise LedgerStateError(f"job {job.id} is already settled")
    return kinds


def touch(session: Session, budget: PrivacyBudget, *, job: Job, actor: str) -> LedgerEntry:
    """Record that a worker is about to open the data: from now on a crash costs the reservation."""
    kinds = _require_open_reservation(session, job)
    if TOUCH in kinds:
        raise LedgerStateError(f"job {job.id} was already touched")
    return _append(
        session,
        budget,
        kind=TOUCH,
        job_id=job.id,
        event=None,
        curve=None,
        actor=actor,
        details={"attempt": job.attempt},
    )


def commit(
    session: Session,
    budget: PrivacyBudget,
    *,
    job: Job,
    actual_event: dict[str, Any],
    actor: str,
    reason: str,
) -> LedgerEntry:
    """Commit the actual cost (≤ reserved) and release the remainder of the reservation."""
    _require_open_reservation(session, job)
    actual = privacy.RdpAccountant().compose(privacy.event_from_json(actual_event)).curve
    reserved = reservation_curve(session, job.id)
    if any(a > r for a, r in zip(actual, reserved, strict=True)):
        raise LedgerStateError(f"job {job.id}: actual cost exceeds its reservation")
    budget.reserved = _reserved_of_other_open_jobs(session, budget.dataset_id, job.id)
    budget.committed = list(privacy.add_curves(tuple(budget.committed), actual))
    # The one place a job's spend is recorded on its row: every view reads it from here.
    job.epsilon_committed = curve_epsilon(actual, job.delta)
    entry = _append(
        session,
        budget,
        kind=COMMIT,
        job_id=job.id,
        event=actual_event,
        curve=list(actual),
        actor=actor,
        details={"reason": reason, "steps_run": job.steps_run},
    )
    remainder = privacy.subtract_curves(reserved, actual)
    if any(value > 0 for value in remainder):
        _append(
            session,
            budget,
            kind=RELEASE,
            job_id=job.id,
            event=None,
            curve=list(remainder),
            actor=actor,
            details={"reason": "unused part of the reservation"},
        )
    return entry


def release(session: Session, budget: PrivacyBudget, *, job: Job, actor: str, reason: str) -> LedgerEntry:
    """Release a whole reservation: only allowed before any worker touched the data."""
    kinds = _require_open_reservation(session, job)
    if TOUCH in kinds:
        raise LedgerStateError(f"job {job.id} touched the data; it must commit, not release")
    budget.reserved = _reserved_of_other_open_jobs(session, budget.dataset_id, job.id)
    job.epsilon_committed = 0.0  # ended without opening the data: nothing was spent
    return _append(
        session,
        budget,
        kind=RELEASE,
        job_id=job.id,
        event=None,
        curve=list(reservation_curve(session, job.id)),
        actor=actor,
        details={"reason": reason},
    )


def curve_epsilon(curve: Sequence[float], delta: float) -> float:
    """Ledger ε of a curve; an all-zero curve (nothing spent) is exactly 0, not the conversion's slack."""
    if not any(curve):
        return 0.0
    return privacy.ledger_epsilon(tuple(curve), delta)


class InvalidAdjustment(ValueError):
    pass


def adjust(
    session: Session,
    budget: PrivacyBudget,
    *,
    epsilon: float,
    delta: float,
    n_rows: int,
    actor: str,
    reason: str,
) -> LedgerEntry:
    """Raise a dataset's budget: an explicit owner action, recorded as its own ADJUST entry.

    Budgets are never lowered or refreshed: lowering could leave admitted jobs above capacity.
    """
    if epsilon < budget.epsilon or delta < budget.delta:
        raise InvalidAdjustment("a budget can only be raised, never lowered")
    if epsilon == budget.epsilon and delta == budget.delta:
        raise InvalidAdjustment("the new budget equals the current one")
    if delta >= 1.0 / n_rows:
        # an upper limit on δ: rounded down, so the message never suggests a δ above it
        raise InvalidAdjustment(f"delta must stay below 1/n = {format_remaining(1.0 / n_rows)}")
    details = {
        "epsilon_from": budget.epsilon,
        "epsilon_to": epsilon,
        "delta_from": budget.delta,
        "delta_to": delta,
        "reason": reason,
    }
    budget.epsilon, budget.delta = epsilon, delta
    return _append(session, budget, kind=ADJUST, job_id=None, event=None, curve=None, actor=actor, details=details)


def adjustments(session: Session, dataset_id: str) -> list[dict[str, Any]]:
    """Every ADJUST entry of a dataset, for reports (docs/privacy-model.md §4: shown in every later report)."""
    entries = session.scalars(
        select(LedgerEntry)
        .where(LedgerEntry.dataset_id == dataset_id, LedgerEntry.kind == ADJUST)
        .order_by(LedgerEntry.seq)
    )
    return [
        {"seq": e.seq, "hash": e.hash, "actor": e.actor, "created_at": _timestamp(e.created_at), **e.details}
        for e in entries
    ]


def budget_summary(budget: PrivacyBudget) -> dict[str, Any]:
    """The budget as public numbers: ε of what is committed and reserved, and what remains."""
    committed = tuple(budget.committed)
    reserved = tuple(budget.reserved)
    cap = capacity(budget.epsilon, budget.delta)
    return {
        "dataset_id": budget.dataset_id,
        "epsilon": budget.epsilon,
        "delta": budget.delta,
        "committed_epsilon": curve_epsilon(committed, budget.delta),
        "reserved_epsilon": curve_epsilon(reserved, budget.delta),
        "spent_epsilon": curve_epsilon(privacy.add_curves(committed, reserved), budget.delta),
        "remaining_epsilon": remaining_epsilon(budget),
        "entries": budget.entry_count,
        "last_hash": budget.last_hash,
        "orders_version": budget.orders_version,
        "per_order": [
            {"order": order, "committed": c, "reserved": r, "capacity": k}
            for order, c, r, k in zip(privacy.ORDERS, committed, reserved, cap, strict=True)
        ],
    }
