"""Independent audit of the privacy ledger: re-derive everything the ledger claims from its entries.

A data owner hands the result to an auditor, so nothing here trusts the caches or the code paths
that wrote the ledger (docs/privacy-model.md#ledger): the hash chain is recomputed, every curve is re-derived
from its event JSON with the current accountant, every job's lifecycle is walked, the cached
totals are rebuilt, and every admission is replayed against the budget in force when it was made.

The audit only reads (one read session, one snapshot) and never raises for a data problem: each
problem becomes an :class:`AuditProblem` with a stable ``code`` (see :data:`PROBLEM_CODES`).
Exact float equality is expected for re-derived curves: the accountant and its outward rounding
are deterministic functions of the event, and JSON stores floats by their shortest repr, which
round-trips exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from kernel import privacy
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget
from kernel.jobs.status import ACTIVE_STATUSES, TERMINAL_STATUSES, JobStatus
from kernel.ledger import operations as ledger
from kernel.privacy.curves import validate_curve
from kernel.privacy.orders import Curve

PROBLEM_CODES: Final[dict[str, str]] = {
    "missing-budget": "the dataset has no budget row",
    "invalid-budget": "the budget row's epsilon/delta have no capacity curve",
    "seq-gap": "sequence numbers are not 1..N without gaps",
    "broken-chain": "an entry's prev_hash is not the previous entry's hash (or genesis)",
    "hash-mismatch": "an entry's stored hash is not the hash of its content",
    "budget-head-mismatch": "the budget row's last_hash/entry_count are not the last entry's",
    "orders-version": "an entry or the budget is on another grid of orders",
    "unknown-kind": "an entry kind outside RESERVE/TOUCH/COMMIT/RELEASE/ADJUST",
    "malformed-entry": "an entry lacks a field its kind needs, or has an invalid curve/event/details",
    "curve-mismatch": "a stored curve differs from the one its event or reservation implies",
    "event-mismatch": "a RESERVE's event differs from its job's event",
    "missing-job": "an entry names a job that does not exist",
    "foreign-job": "an entry names a job of another dataset",
    "lifecycle": "a job's entries break RESERVE, [TOUCH], COMMIT [+RELEASE] | RELEASE (no TOUCH)",
    "unsettled-terminal-job": "a succeeded/failed/cancelled job still holds its reservation",
    "settled-open-job": "a queued/running job's reservation was already settled",
    "unknown-job-status": "a job's status is not one the service knows",
    "commit-exceeds-reservation": "a COMMIT curve is above its RESERVE curve at some order",
    "total-mismatch": "the budget row's cached committed/reserved differ from the entries",
    "adjust-mismatch": "ADJUST entries do not chain from one budget to the next, or to the row",
    "over-capacity": "committed + reserved exceed the capacity at every order",
    "inadmissible-reservation": "a RESERVE did not fit the budget in force when it was made",
}

JOB_KINDS: Final[frozenset[str]] = frozenset({ledger.RESERVE, ledger.TOUCH, ledger.COMMIT, ledger.RELEASE})
CURVE_KINDS: Final[frozenset[str]] = frozenset({ledger.RESERVE, ledger.COMMIT, ledger.RELEASE})
OPEN_STATUSES: Final[frozenset[JobStatus]] = ACTIVE_STATUSES
COMMITTED_RELATIVE_TOLERANCE: Final[float] = 1e-12
"""Committed is folded in seq order, as the ledger does, so it should agree exactly."""
RESERVED_RELATIVE_TOLERANCE: Final[float] = 1e-9
"""The ledger rebuilds reserved from open jobs in database order, so summation order differs."""
ADJUST_KEYS: Final[tuple[str, ...]] = ("epsilon_from", "epsilon_to", "delta_from", "delta_to")


@dataclass(frozen=True)
class AuditProblem:
    dataset_id: str
    seq: int | None
    code: str
    message: str


@dataclass(frozen=True)
class AuditReport:
    datasets_checked: int
    entries_checked: int
    problems: tuple[AuditProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


# --------------------------------------------------------------------------- snapshot of one dataset


@dataclass
class _Trail:
    """One job's entries, classified by the lifecycle walk (the first of each role wins)."""

    job_id: str
    reserve: LedgerEntry | None = None
    touch: LedgerEntry | None = None
    commit: LedgerEntry | None = None
    remainder_release: LedgerEntry | None = None
    full_release: LedgerEntry | None = None
    violations: list[tuple[int, str]] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        return self.commit is not None or self.full_release is not None or self.remainder_release is not None


@dataclass(frozen=True)
class _DatasetLedger:
    """Everything the checks of one dataset read; loaded once so that they all see one snapshot."""

    dataset_id: str
    budget: PrivacyBudget | None
    entries: tuple[LedgerEntry, ...]
    jobs: dict[str, Job]
    """Every job of the dataset and every job its entries name (which may belong elsewhere)."""

    def problem(self, seq: int | None, code: str, message: str) -> AuditProblem:
        return AuditProblem(dataset_id=self.dataset_id, seq=seq, code=code, message=message)

    @cached_property
    def own_jobs(self) -> tuple[Job, ...]:
        return tuple(job for job in self.jobs.values() if job.dataset_id == self.dataset_id)

    @cached_property
    def trails(self) -> dict[str, _Trail]:
        trails: dict[str, _Trail] = {}
        for entry in self.entries:
            if entry.kind in JOB_KINDS and entry.job_id is not None:
                trail = trails.setdefault(entry.job_id, _Trail(entry.job_id))
                _advance(trail, entry)
        return trails

    @cached_property
    def current_capacity(self) -> Curve | None:
        if self.budget is None:
            return None
        return _capacity(self.budget.epsilon, self.budget.delta)


def _advance(trail: _Trail, entry: LedgerEntry) -> None:
    """One step of the per-job state machine; a step that is not allowed is recorded, not raised."""

    def violate(text: str) -> None:
        trail.violations.append((entry.seq, f"job {trail.job_id}: {entry.kind} {text}"))

    if entry.kind == ledger.RESERVE:
        if trail.reserve is None:
            trail.reserve = entry
        else:
            violate(f"is a second reservation (first at seq {trail.reserve.seq})")
        return
    if trail.reserve is None:
        violate("comes before any RESERVE")
    remainder_due = trail.commit is not None and trail.remainder_release is None
    if trail.settled and not (entry.kind == ledger.RELEASE and remainder_due):
        violate("comes after the job was already settled")
        return
    if entry.kind == ledger.TOUCH:
        if trail.touch is not None:
            violate(f"repeats the TOUCH at seq {trail.touch.seq}")
        else:
            trail.touch = entry
    elif entry.kind == ledger.COMMIT:
        trail.commit = entry
    elif entry.kind == ledger.RELEASE:
        _advance_release(trail, entry, violate)


def _advance_release(trail: _Trail, entry: LedgerEntry, violate: Callable[[str], None]) -> None:
    if trail.commit is not None:
        trail.remainder_release = entry
        if entry.seq != trail.commit.seq + 1:
            violate(f"of the remainder does not immediately follow its COMMIT at seq {trail.commit.seq}")
        return
    trail.full_release = entry
    if trail.touch is not None:
        violate(f"without COMMIT after the TOUCH at seq {trail.touch.seq}: the data was opened, it must commit")


# --------------------------------------------------------------------------- value helpers


def _curve(value: Any) -> Curve | None:
    """The curve as a float tuple if it is a valid cost on the grid, else None."""
    if not isinstance(value, (list, tuple)):
        return None
    try:
        return validate_curve(value, name="curve")
    except privacy.PrivacyEventError:
        return None


def _capacity(epsilon: Any, delta: Any) -> Curve | None:
    try:
        return ledger.capacity(float(epsilon), float(delta))
    except (privacy.PrivacyEventError, TypeError, ValueError):
        return None


def _derived_curve(event: Any) -> Curve | str:
    """The curve the current accountant gives the event JSON, or why it has none."""
    try:
        return privacy.RdpAccountant().compose(privacy.event_from_json(event)).curve
    except (TypeError, ValueError) as error:  # PrivacyEventError is a ValueError
        return f"event JSON does not parse as a privacy event ({error})"


def _fold(curves: Sequence[Curve]) -> Curve:
    total: Curve = tuple(ledger.zero_curve())
    for curve in curves:
        total = privacy.add_curves(total, curve)
    return total


def _close(expected: Curve, actual: Curve, *, rel: float) -> bool:
    return all(math.isclose(e, a, rel_tol=rel, abs_tol=0.0) for e, a in zip(expected, actual, strict=True))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _adjustment(entry: LedgerEntry) -> tuple[float, float, float, float] | None:
    """(epsilon_from, epsilon_to, delta_from, delta_to) of a well-formed ADJUST, else None."""
    details = entry.details
    if not isinstance(details, dict) or not all(_is_number(details.get(key)) for key in ADJUST_KEYS):
        return None
    eps_from, eps_to, delta_from, delta_to = (float(details[key]) for key in ADJUST_KEYS)
    if _capacity(eps_from, delta_from) is None or _capacity(eps_to, delta_to) is None:
        return None
    return eps_from, eps_to, delta_from, delta_to


def _adjustments(data: _DatasetLedger) -> list[tuple[LedgerEntry, tuple[float, float, float, float]]]:
    return [
        (entry, values)
        for entry in data.entries
        if entry.kind == ledger.ADJUST and (values := _adjustment(entry)) is not None
    ]


def _initial_budget(data: _DatasetLedger) -> tuple[float, float] | None:
    """The budget before any ADJUST: the first ADJUST's 'from', else the row's current values."""
    adjustments = _adjustments(data)
    if adjustments:
        _, (eps_from, _, delta_from, _) = adjustments[0]
        return eps_from, delta_from
    if data.budget is None:
        return None
    return data.budget.epsilon, data.budget.delta


def _genesis(data: _DatasetLedger) -> str:
    """The anchor commits to the opening budget: an edited budget row breaks the first link."""
    initial = _initial_budget(data)
    orders_version = data.budget.orders_version if data.budget is not None else privacy.ORDERS_VERSION
    if initial is None:
        return ""
    return ledger.genesis_hash(data.dataset_id, epsilon=initial[0], delta=initial[1], orders_version=orders_version)


# --------------------------------------------------------------------------- checks

Check = Callable[[_DatasetLedger], Iterator[AuditProblem]]


def check_budget_row(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Without a budget row nothing was ever admissible; without a capacity nothing can be replayed."""
    if data.budget is None:
        yield data.problem(None, "missing-budget", "no privacy_budgets row for this dataset")
        return
    if data.current_capacity is None:
        yield data.problem(
            None,
            "invalid-budget",
            f"epsilon={data.budget.epsilon!r}, delta={data.budget.delta!r} is not a valid budget",
        )
    if data.budget.orders_version != privacy.ORDERS_VERSION:
        yield data.problem(
            None,
            "orders-version",
            f"budget is on {data.budget.orders_version!r}; this accountant uses {privacy.ORDERS_VERSION!r}",
        )


def check_sequence(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """A gap means an entry was deleted (or never committed): the history is incomplete."""
    for expected, entry in enumerate(data.entries, start=1):
        if entry.seq != expected:
            yield data.problem(entry.seq, "seq-gap", f"expected seq {expected}, found {entry.seq}")


def check_chain(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Each entry must name its predecessor's stored hash, so no entry can be removed or reordered."""
    previous = _genesis(data)
    for entry in data.entries:
        if entry.prev_hash != previous:
            yield data.problem(entry.seq, "broken-chain", "prev_hash is not the hash of the previous entry")
        previous = entry.hash


def check_hashes(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Recomputing the hash detects an edit of any hashed field of the entry."""
    for entry in data.entries:
        try:
            recomputed = ledger.entry_hash(entry)
        except (TypeError, ValueError, AttributeError) as error:
            yield data.problem(entry.seq, "hash-mismatch", f"content cannot be hashed ({error})")
            continue
        if recomputed != entry.hash:
            yield data.problem(entry.seq, "hash-mismatch", "stored hash differs from the hash of the entry's content")


def check_budget_head(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """The budget row pins the chain's head, so truncating the newest entries is detected."""
    if data.budget is None:
        return
    last = data.entries[-1] if data.entries else None
    head = last.hash if last is not None else _genesis(data)
    count = last.seq if last is not None else 0
    if data.budget.last_hash != head:
        yield data.problem(None, "budget-head-mismatch", "budget last_hash is not the last entry's hash")
    if data.budget.entry_count != count or count != len(data.entries):
        yield data.problem(
            None,
            "budget-head-mismatch",
            f"budget entry_count={data.budget.entry_count}, last seq={count}, entries={len(data.entries)}",
        )


def check_entry_shape(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Every later check relies on each kind carrying the fields it needs, on one grid."""
    for entry in data.entries:
        if entry.kind not in ledger.ENTRY_KINDS:
            yield data.problem(entry.seq, "unknown-kind", f"unknown entry kind {entry.kind!r}")
            continue
        if data.budget is not None and entry.orders_version != data.budget.orders_version:
            yield data.problem(
                entry.seq,
                "orders-version",
                f"entry is on {entry.orders_version!r}, budget on {data.budget.orders_version!r}",
            )
        yield from _shape_problems(data, entry)


def _shape_problems(data: _DatasetLedger, entry: LedgerEntry) -> Iterator[AuditProblem]:
    if (entry.job_id is None) == (entry.kind in JOB_KINDS):
        needs = "needs" if entry.kind in JOB_KINDS else "must not have"
        yield data.problem(entry.seq, "malformed-entry", f"{entry.kind} {needs} a job_id")
    if entry.kind in CURVE_KINDS and _curve(entry.curve) is None:
        yield data.problem(entry.seq, "malformed-entry", f"{entry.kind} curve is not a valid cost on the grid")
    if entry.kind not in CURVE_KINDS and entry.curve is not None:
        yield data.problem(entry.seq, "malformed-entry", f"{entry.kind} must not carry a curve")
    if entry.kind == ledger.ADJUST and _adjustment(entry) is None:
        yield data.problem(entry.seq, "malformed-entry", f"ADJUST details need valid {', '.join(ADJUST_KEYS)}")


def check_derived_curves(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """A charged curve must be what the current accountant gives its event, so no cost was shaded."""
    for entry in data.entries:
        if entry.kind not in (ledger.RESERVE, ledger.COMMIT):
            continue
        derived = _derived_curve(entry.event)
        if isinstance(derived, str):
            yield data.problem(entry.seq, "malformed-entry", derived)
            continue
        stored = _curve(entry.curve)
        if stored is not None and stored != derived:
            yield data.problem(entry.seq, "curve-mismatch", _curve_mismatch_text(entry, stored, derived))


def _curve_mismatch_text(entry: LedgerEntry, stored: Curve, derived: Curve) -> str:
    order = next(o for o, s, d in zip(privacy.ORDERS, stored, derived, strict=True) if s != d)
    text = f"stored {entry.kind} curve differs from its event's curve (first at order {order})"
    if entry.accountant_version != privacy.ACCOUNTANT_VERSION:
        text += f"; written by {entry.accountant_version!r}, audited with {privacy.ACCOUNTANT_VERSION!r}"
    return text


def check_job_references(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """A RESERVE must charge exactly the job's own event and curve, on the job's own dataset."""
    reported: set[str] = set()
    for entry in data.entries:
        if entry.job_id is None or entry.job_id in reported:
            continue
        job = data.jobs.get(entry.job_id)
        if job is None:
            reported.add(entry.job_id)
            yield data.problem(entry.seq, "missing-job", f"job {entry.job_id} does not exist")
        elif job.dataset_id != data.dataset_id:
            reported.add(entry.job_id)
            yield data.problem(entry.seq, "foreign-job", f"job {job.id} belongs to dataset {job.dataset_id}")
        elif entry.kind == ledger.RESERVE:
            yield from _reserve_matches_job(data, entry, job)


def _reserve_matches_job(data: _DatasetLedger, entry: LedgerEntry, job: Job) -> Iterator[AuditProblem]:
    if entry.event != job.event:
        yield data.problem(entry.seq, "event-mismatch", f"RESERVE event differs from job {job.id}'s event")
    stored, planned = _curve(entry.curve), _curve(job.reserved_curve)
    if stored is None:
        return  # reported by check_entry_shape
    if planned is None:
        yield data.problem(entry.seq, "malformed-entry", f"job {job.id}'s reserved_curve is not a valid cost")
    elif stored != planned:
        yield data.problem(entry.seq, "curve-mismatch", f"RESERVE curve differs from job {job.id}'s reserved_curve")


def check_lifecycle(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """RESERVE, [TOUCH], COMMIT [+RELEASE] | RELEASE-before-TOUCH; every job has its reservation."""
    for trail in data.trails.values():
        for seq, text in trail.violations:
            yield data.problem(seq, "lifecycle", text)
    for job in data.own_jobs:
        job_trail = data.trails.get(job.id)
        if job_trail is None or job_trail.reserve is None:
            yield data.problem(None, "lifecycle", f"job {job.id} has no RESERVE entry")


def check_settlements(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """A settlement may spend at most what was reserved and must give back exactly the rest."""
    for trail in data.trails.values():
        reserved = _curve(trail.reserve.curve) if trail.reserve is not None else None
        if reserved is None:
            continue
        if trail.full_release is not None:
            released = _curve(trail.full_release.curve)
            if released is not None and released != reserved:
                yield data.problem(
                    trail.full_release.seq,
                    "curve-mismatch",
                    f"RELEASE of job {trail.job_id} is not its whole reservation",
                )
        if trail.commit is not None:
            yield from _commit_problems(data, trail, reserved)


def _commit_problems(data: _DatasetLedger, trail: _Trail, reserved: Curve) -> Iterator[AuditProblem]:
    assert trail.commit is not None
    committed = _curve(trail.commit.curve)
    if committed is None:
        return
    over = [o for o, c, r in zip(privacy.ORDERS, committed, reserved, strict=True) if c > r]
    if over:
        yield data.problem(
            trail.commit.seq,
            "commit-exceeds-reservation",
            f"COMMIT of job {trail.job_id} exceeds its reservation at orders {over}",
        )
    remainder = privacy.subtract_curves(reserved, committed)
    if trail.remainder_release is None:
        if any(remainder):
            yield data.problem(
                trail.commit.seq,
                "lifecycle",
                f"COMMIT of job {trail.job_id} leaves a remainder that no RELEASE returns",
            )
        return
    released = _curve(trail.remainder_release.curve)
    if released is not None and released != remainder:
        yield data.problem(
            trail.remainder_release.seq,
            "curve-mismatch",
            f"RELEASE of job {trail.job_id} is not its reservation minus its COMMIT",
        )


def check_job_status(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """A finished job must have settled its reservation; a live one must still hold it."""
    for job in data.own_jobs:
        trail = data.trails.get(job.id)
        settled = trail is not None and trail.settled
        if job.status in TERMINAL_STATUSES and not settled:
            yield data.problem(None, "unsettled-terminal-job", f"job {job.id} is {job.status} but unsettled")
        elif job.status in OPEN_STATUSES and settled:
            yield data.problem(None, "settled-open-job", f"job {job.id} is {job.status} but already settled")
        elif job.status not in frozenset(JobStatus):
            yield data.problem(None, "unknown-job-status", f"job {job.id} has status {job.status!r}")


def _recomputed_committed(data: _DatasetLedger) -> Curve:
    curves = [c for e in data.entries if e.kind == ledger.COMMIT and (c := _curve(e.curve)) is not None]
    return _fold(curves)


def _recomputed_reserved(data: _DatasetLedger) -> Curve:
    open_reserves = [t.reserve for t in data.trails.values() if t.reserve is not None and not t.settled]
    open_reserves.sort(key=lambda entry: entry.seq)
    return _fold([c for entry in open_reserves if (c := _curve(entry.curve)) is not None])


def check_totals(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """The budget row's totals are only a cache; the entries are the truth (docs/privacy-model.md#ledger)."""
    if data.budget is None:
        return
    committed, reserved = _recomputed_committed(data), _recomputed_reserved(data)
    cached_committed, cached_reserved = _curve(data.budget.committed), _curve(data.budget.reserved)
    if cached_committed is None or not _close(committed, cached_committed, rel=COMMITTED_RELATIVE_TOLERANCE):
        yield data.problem(None, "total-mismatch", "cached committed differs from the sum of COMMIT entries")
    if cached_reserved is None or not _close(reserved, cached_reserved, rel=RESERVED_RELATIVE_TOLERANCE):
        yield data.problem(None, "total-mismatch", "cached reserved differs from the sum of open reservations")


def check_adjustments(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Every budget change must be an ADJUST that starts where the last one ended and ends at the row."""
    if data.budget is None:
        return
    adjustments = _adjustments(data)
    if not adjustments:
        return
    _, (running_eps, _, running_delta, _) = adjustments[0]
    for entry, (eps_from, eps_to, delta_from, delta_to) in adjustments:
        if (eps_from, delta_from) != (running_eps, running_delta):
            yield data.problem(
                entry.seq,
                "adjust-mismatch",
                f"ADJUST starts at ({eps_from}, {delta_from}), budget was ({running_eps}, {running_delta})",
            )
        running_eps, running_delta = eps_to, delta_to
    if (running_eps, running_delta) != (data.budget.epsilon, data.budget.delta):
        yield data.problem(
            None,
            "adjust-mismatch",
            f"last ADJUST ends at ({running_eps}, {running_delta}); budget row has "
            f"({data.budget.epsilon}, {data.budget.delta})",
        )


def check_capacity(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """The filter's invariant: what is committed and reserved fits the budget at some order."""
    if data.current_capacity is None:
        return
    zero = tuple(ledger.zero_curve())
    fits = privacy.admission_order(
        committed=_recomputed_committed(data),
        reserved=_recomputed_reserved(data),
        cost=zero,
        capacity=data.current_capacity,
    )
    if fits is None:
        yield data.problem(None, "over-capacity", "committed + reserved exceed the capacity at every order")


def check_admissions(data: _DatasetLedger) -> Iterator[AuditProblem]:
    """Replay the filter: each RESERVE must have fit the state and the budget in force at its time."""
    initial = _initial_budget(data)
    capacity = _capacity(*initial) if initial is not None else None
    committed: Curve = tuple(ledger.zero_curve())
    open_reservations: dict[str, Curve] = {}
    for entry in data.entries:
        curve = _curve(entry.curve)
        if entry.kind == ledger.ADJUST and (values := _adjustment(entry)) is not None:
            capacity = _capacity(values[1], values[3])
        elif entry.kind == ledger.RESERVE and curve is not None and entry.job_id is not None:
            if capacity is not None and not _admissible(committed, open_reservations, curve, capacity):
                yield data.problem(
                    entry.seq, "inadmissible-reservation", f"RESERVE of job {entry.job_id} did not fit the budget then"
                )
            yield from _check_recorded_admission(data, entry, committed, open_reservations, curve, capacity)
            previous = open_reservations.get(entry.job_id)
            open_reservations[entry.job_id] = curve if previous is None else privacy.add_curves(previous, curve)
        elif entry.kind == ledger.COMMIT and curve is not None:
            committed = privacy.add_curves(committed, curve)
            open_reservations.pop(entry.job_id or "", None)
        elif entry.kind == ledger.RELEASE:
            open_reservations.pop(entry.job_id or "", None)


def _check_recorded_admission(
    data: _DatasetLedger,
    entry: LedgerEntry,
    committed: Curve,
    open_reservations: dict[str, Curve],
    cost: Curve,
    capacity: Curve | None,
) -> Iterator[AuditProblem]:
    """The totals a RESERVE records it was admitted against: they must fit exactly and agree
    with the replay (which may differ in the last bits because sums run in another order)."""
    recorded = (entry.details or {}).get("admitted_against")
    if recorded is None:
        return
    got_committed, got_reserved = _curve(recorded.get("committed")), _curve(recorded.get("reserved"))
    if got_committed is None or got_reserved is None:
        yield data.problem(entry.seq, "malformed-entry", "admitted_against is not a pair of curves")
        return
    replayed = _fold(list(open_reservations.values()))
    if not (_close(got_committed, committed, rel=1e-12) and _close(got_reserved, replayed, rel=1e-9)):
        yield data.problem(entry.seq, "total-mismatch", "admitted_against differs from the replayed totals")
    if (
        capacity is not None
        and privacy.admission_order(committed=got_committed, reserved=got_reserved, cost=cost, capacity=capacity)
        is None
    ):
        yield data.problem(entry.seq, "inadmissible-reservation", "the recorded totals do not admit this RESERVE")


def _admissible(committed: Curve, open_reservations: dict[str, Curve], cost: Curve, capacity: Curve) -> bool:
    reserved = _fold(list(open_reservations.values()))
    order = privacy.admission_order(committed=committed, reserved=reserved, cost=cost, capacity=capacity)
    return order is not None


CHECKS: Final[tuple[Check, ...]] = (
    check_budget_row,
    check_sequence,
    check_chain,
    check_hashes,
    check_budget_head,
    check_entry_shape,
    check_derived_curves,
    check_job_references,
    check_lifecycle,
    check_settlements,
    check_job_status,
    check_totals,
    check_adjustments,
    check_capacity,
    check_admissions,
)
"""Run in this order; each check is independent and reports what it finds without raising."""


# --------------------------------------------------------------------------- entry points


def verify_ledger(db: Database, *, dataset_id: str | None = None) -> AuditReport:
    """Audit one dataset's ledger, or every dataset's; read-only, from one consistent snapshot."""
    problems: list[AuditProblem] = []
    entries_checked = 0
    with db.read_session() as session:
        if not db.sqlite:
            # One snapshot for the whole audit: READ COMMITTED would let a concurrent writer's
            # entries appear between the queries and look like a broken chain.
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        dataset_ids = [dataset_id] if dataset_id is not None else _all_dataset_ids(session)
        public = set(session.scalars(select(Dataset.id).where(Dataset.public.is_(True))))
        for current in dataset_ids:
            data = _load(session, current)
            entries_checked += len(data.entries)
            problems.extend(_audit_public(data) if current in public else _audit(data))
    return AuditReport(datasets_checked=len(dataset_ids), entries_checked=entries_checked, problems=tuple(problems))


def _audit(data: _DatasetLedger) -> list[AuditProblem]:
    """All checks' problems of one dataset, in entry order (dataset-level problems last)."""
    found = [problem for check in CHECKS for problem in check(data)]
    return sorted(found, key=lambda p: (p.seq is None, p.seq or 0))


def _audit_public(data: _DatasetLedger) -> list[AuditProblem]:
    """A public dataset has no budget: its budget row is only a lock, and it has no entries."""
    return [
        data.problem(entry.seq, "public-dataset-entry", "a public dataset has no ledger, yet this entry exists")
        for entry in data.entries
    ]


def _all_dataset_ids(session: Session) -> list[str]:
    ids: set[str] = set(session.scalars(select(Dataset.id)))
    ids.update(session.scalars(select(PrivacyBudget.dataset_id)))
    ids.update(session.scalars(select(LedgerEntry.dataset_id).distinct()))
    return sorted(ids)


def _load(session: Session, dataset_id: str) -> _DatasetLedger:
    budget = session.get(PrivacyBudget, dataset_id)
    entries = tuple(
        session.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id).order_by(LedgerEntry.seq))
    )
    named = {entry.job_id for entry in entries if entry.job_id is not None}
    jobs = session.scalars(select(Job).where(or_(Job.dataset_id == dataset_id, Job.id.in_(named))))
    return _DatasetLedger(dataset_id=dataset_id, budget=budget, entries=entries, jobs={job.id: job for job in jobs})


def format_report(report: AuditReport) -> str:
    """One line per problem and a summary line, for a CLI or an auditor's file."""
    lines = [f"{p.dataset_id} seq={p.seq if p.seq is not None else '-'} {p.code}: {p.message}" for p in report.problems]
    scope = f"{report.datasets_checked} dataset(s), {report.entries_checked} entries checked"
    if report.ok:
        lines.append(f"ledger audit OK: {scope}")
    else:
        failing = len({p.dataset_id for p in report.problems})
        lines.append(f"ledger audit FAILED: {len(report.problems)} problem(s) in {failing} of {scope}")
    return "\n".join(lines)
