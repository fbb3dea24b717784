"""The ledger audit: a clean ledger verifies, and each kind of tampering or bypass is caught."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import delete, select, text, update
from sqlalchemy.orm import Session

from kernel import privacy
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger
from kernel.ledger.audit import PROBLEM_CODES, AuditReport, format_report, verify_ledger
from tests.ledger_fixtures import budgeted_dataset

Q = 0.01


def _event(sigma: float = 1.0, steps: int = 100) -> dict[str, Any]:
    return privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=Q, noise_multiplier=sigma, count=steps)
    )


def _submit(db: Database, dataset_id: str, *, sigma: float = 1.0, steps: int = 100) -> str:
    """As the API does: create the queued job and reserve it in one locked transaction."""
    event = _event(sigma, steps)
    with db.write_transaction() as s:
        budget = ledger.lock_budget(s, dataset_id)
        job = Job(
            tenant_id=s.get(Dataset, dataset_id).tenant_id,
            dataset_id=dataset_id,
            status="queued",
            spec={},
            algorithm="dp-sgd",
            model_name="m",
            noise_multiplier=sigma,
            sampling_probability=Q,
            steps_planned=steps,
            delta=1e-5,
            epsilon_ledger=1.0,
            event=event,
            reserved_curve=list(privacy.rdp_curve(privacy.event_from_json(event))),
        )
        s.add(job)
        s.flush()
        ledger.reserve(s, budget, job=job, actor="tenant:t")
        return job.id


def _locked(db: Database, job_id: str, action: Callable[[Session, PrivacyBudget, Job], object]) -> None:
    with db.write_transaction() as s:
        job = s.get(Job, job_id)
        action(s, ledger.lock_budget(s, job.dataset_id), job)


def _claim(db: Database, job_id: str) -> None:
    """As the worker does: queued -> running and TOUCH in one transaction."""

    def claim(s: Session, budget: PrivacyBudget, job: Job) -> None:
        job.status, job.attempt = "running", job.attempt + 1
        ledger.touch(s, budget, job=job, actor="worker")

    _locked(db, job_id, claim)


def _settle(db: Database, job_id: str, *, status: str, event: dict[str, Any] | None = None) -> None:
    """Commit ``event`` (default: the full reservation) and set the terminal status, as the worker does."""

    def settle(s: Session, budget: PrivacyBudget, job: Job) -> None:
        ledger.commit(s, budget, job=job, actual_event=event or job.event, actor="worker", reason=status)
        job.status = status

    _locked(db, job_id, settle)


def _cancel_queued(db: Database, job_id: str) -> None:
    """As the API's cancel of a queued job: status first, then release the whole reservation."""

    def cancel(s: Session, budget: PrivacyBudget, job: Job) -> None:
        job.status = "cancelled"
        ledger.release(s, budget, job=job, actor="tenant:t", reason="cancelled before start")

    _locked(db, job_id, cancel)


@dataclass(frozen=True)
class Built:
    dataset_id: str
    other_dataset_id: str
    succeeded: str
    cancelled: str
    failed: str
    queued: str


@pytest.fixture
def built(database: Database) -> Built:
    """Ten entries on one dataset, two on another, every settlement path the service takes."""
    dataset_id = budgeted_dataset(database)
    succeeded, cancelled = _submit(database, dataset_id), _submit(database, dataset_id, sigma=2.0)
    failed = _submit(database, dataset_id, sigma=1.5, steps=50)
    _claim(database, succeeded)
    queued = _submit(database, dataset_id, sigma=3.0)
    _settle(database, succeeded, status="succeeded", event=_event(steps=40))  # COMMIT + remainder RELEASE
    _cancel_queued(database, cancelled)
    _claim(database, failed)
    _settle(database, failed, status="failed")  # full COMMIT, nothing left to release
    other = budgeted_dataset(database, tenant="u")
    _cancel_queued(database, _submit(database, other))
    return Built(dataset_id, other, succeeded, cancelled, failed, queued)


def _codes(report: AuditReport) -> set[str]:
    return {problem.code for problem in report.problems}


def _entry(db: Database, dataset_id: str, *, kind: str, job_id: str | None = None) -> LedgerEntry:
    with db.read_session() as s:
        query = select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id, LedgerEntry.kind == kind)
        if job_id is not None:
            query = query.where(LedgerEntry.job_id == job_id)
        entry = s.scalars(query.order_by(LedgerEntry.seq)).first()
        assert entry is not None
        s.expunge(entry)
        return entry


def _tamper(db: Database, statement: Any) -> None:
    """An attacker with database access: one statement, no ledger code involved."""
    with db.write_transaction() as s:
        assert s.execute(statement).rowcount == 1


def test_clean_ledger_verifies(database: Database, built: Built) -> None:
    with database.read_session() as s:
        kinds = list(
            s.scalars(
                select(LedgerEntry.kind).where(LedgerEntry.dataset_id == built.dataset_id).order_by(LedgerEntry.seq)
            )
        )
    assert kinds == ["RESERVE"] * 3 + ["TOUCH", "RESERVE", "COMMIT", "RELEASE", "RELEASE", "TOUCH", "COMMIT"]
    report = verify_ledger(database)
    assert report.ok, format_report(report)
    assert (report.datasets_checked, report.entries_checked) == (2, 12)
    assert format_report(report) == "ledger audit OK: 2 dataset(s), 12 entries checked"


def test_dataset_filter(database: Database, built: Built) -> None:
    report = verify_ledger(database, dataset_id=built.other_dataset_id)
    assert report.ok and (report.datasets_checked, report.entries_checked) == (1, 2)
    _tamper(
        database,
        update(LedgerEntry).where(LedgerEntry.dataset_id == built.dataset_id, LedgerEntry.seq == 2).values(actor="x"),
    )
    assert verify_ledger(database, dataset_id=built.other_dataset_id).ok
    report = verify_ledger(database, dataset_id=built.dataset_id)
    assert (report.datasets_checked, report.entries_checked) == (1, 10)
    assert [(p.dataset_id, p.seq, p.code) for p in report.problems] == [(built.dataset_id, 2, "hash-mismatch")]
    assert not verify_ledger(database).ok


def test_unknown_dataset_is_reported(database: Database, built: Built) -> None:
    report = verify_ledger(database, dataset_id="ds_missing")
    assert _codes(report) == {"missing-budget"} and report.datasets_checked == 1


def _halved(curve: list[float]) -> list[float]:
    return [value / 2 for value in curve]


TAMPERS: dict[str, tuple[Callable[[Built, Callable[..., LedgerEntry]], Any], set[str]]] = {
    # one column of one entry, hash left alone
    "commit curve": (
        lambda b, e: (
            update(LedgerEntry)
            .where(LedgerEntry.id == e(kind="COMMIT").id)
            .values(curve=_halved(e(kind="COMMIT").curve))
        ),
        {"hash-mismatch", "curve-mismatch", "total-mismatch"},
    ),
    "reserve details": (
        lambda b, e: (
            update(LedgerEntry).where(LedgerEntry.id == e(kind="RESERVE").id).values(details={"witness_order": 2.0})
        ),
        {"hash-mismatch"},
    ),
    "release kind": (
        lambda b, e: (
            update(LedgerEntry).where(LedgerEntry.id == e(kind="RELEASE", job_id=b.cancelled).id).values(kind="TOUCH")
        ),
        {"hash-mismatch", "malformed-entry", "unsettled-terminal-job", "total-mismatch"},
    ),
    "actor": (
        lambda b, e: update(LedgerEntry).where(LedgerEntry.id == e(kind="TOUCH").id).values(actor="someone else"),
        {"hash-mismatch"},
    ),
    "delete middle entry": (
        lambda b, e: delete(LedgerEntry).where(LedgerEntry.id == e(kind="RELEASE", job_id=b.cancelled).id),
        {"seq-gap", "broken-chain", "budget-head-mismatch", "unsettled-terminal-job", "total-mismatch"},
    ),
    "delete last entry": (
        lambda b, e: delete(LedgerEntry).where(LedgerEntry.id == e(kind="COMMIT", job_id=b.failed).id),
        {"budget-head-mismatch", "unsettled-terminal-job", "total-mismatch"},
    ),
    # the budget row and the jobs
    "committed cache": (
        lambda b, e: (
            update(PrivacyBudget).where(PrivacyBudget.dataset_id == b.dataset_id).values(committed=ledger.zero_curve())
        ),
        {"total-mismatch"},
    ),
    "budget head": (
        lambda b, e: update(PrivacyBudget).where(PrivacyBudget.dataset_id == b.dataset_id).values(last_hash="0" * 64),
        {"budget-head-mismatch"},
    ),
    "budget epsilon lowered": (
        lambda b, e: update(PrivacyBudget).where(PrivacyBudget.dataset_id == b.dataset_id).values(epsilon=0.05),
        {"broken-chain", "over-capacity", "inadmissible-reservation"},  # the anchor commits to the budget
    ),
    "job reserved_curve": (
        lambda b, e: (
            update(Job)
            .where(Job.id == b.queued)
            .values(reserved_curve=_halved(e(kind="RESERVE", job_id=b.queued).curve))
        ),
        {"curve-mismatch"},
    ),
    "job event": (
        lambda b, e: update(Job).where(Job.id == b.queued).values(event=_event(sigma=3.0, steps=10)),
        {"event-mismatch"},
    ),
    "queued job marked succeeded": (
        lambda b, e: update(Job).where(Job.id == b.queued).values(status="succeeded"),
        {"unsettled-terminal-job"},
    ),
    "settled job marked running": (
        lambda b, e: update(Job).where(Job.id == b.failed).values(status="running"),
        {"settled-open-job"},
    ),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_tampering_is_detected(database: Database, built: Built, name: str) -> None:
    make_statement, expected = TAMPERS[name]

    def entry(*, kind: str, job_id: str | None = None) -> LedgerEntry:
        return _entry(database, built.dataset_id, kind=kind, job_id=job_id)

    _tamper(database, make_statement(built, entry))
    report = verify_ledger(database)
    assert _codes(report) == expected, format_report(report)
    assert {p.dataset_id for p in report.problems} == {built.dataset_id}
    assert _codes(report) <= set(PROBLEM_CODES)
    summary = format_report(report).splitlines()
    assert len(summary) == len(report.problems) + 1 and summary[-1].startswith("ledger audit FAILED")


def _forge(database: Database, entry: LedgerEntry, **values: Any) -> None:
    """Rewrite an entry's fields AND recompute its hash, so the entry is self-consistent."""
    for key, value in values.items():
        setattr(entry, key, value)
    entry.hash = ledger.entry_hash(entry)
    _tamper(database, update(LedgerEntry).where(LedgerEntry.id == entry.id).values(**values, hash=entry.hash))


def test_forged_entry_breaks_the_next_link(database: Database, built: Built) -> None:
    commit = _entry(database, built.dataset_id, kind="COMMIT", job_id=built.succeeded)
    _forge(database, commit, curve=_halved(commit.curve))
    problems = {(p.seq, p.code) for p in verify_ledger(database).problems}
    assert (commit.seq, "hash-mismatch") not in problems
    assert {(commit.seq + 1, "broken-chain"), (commit.seq, "curve-mismatch")} <= problems


def test_forged_tail_with_budget_head_is_detected(database: Database, built: Built) -> None:
    """Forging the last entry and the budget head leaves the chain intact; the event still gives it away."""
    commit = _entry(database, built.dataset_id, kind="COMMIT", job_id=built.failed)
    _forge(database, commit, curve=_halved(commit.curve))
    _tamper(
        database,
        update(PrivacyBudget).where(PrivacyBudget.dataset_id == built.dataset_id).values(last_hash=commit.hash),
    )
    # ...and a full-reservation COMMIT that is now smaller leaves a remainder nobody released
    assert _codes(verify_ledger(database)) == {"curve-mismatch", "total-mismatch", "lifecycle"}


def test_forged_cheaper_commit_event_is_detected(database: Database, built: Built) -> None:
    """A cheaper COMMIT event with its own curve and hash, and a re-hashed chain after it, and fixed caches."""
    commit = _entry(database, built.dataset_id, kind="COMMIT", job_id=built.succeeded)
    cheaper = _event(steps=10)
    _forge(database, commit, event=cheaper, curve=list(privacy.rdp_curve(privacy.event_from_json(cheaper))))
    with database.write_transaction() as s:  # re-chain everything after it and fix the budget row
        budget = s.get(PrivacyBudget, built.dataset_id)
        entries = list(
            s.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == built.dataset_id).order_by(LedgerEntry.seq))
        )
        previous = ledger.genesis_hash(
            built.dataset_id, epsilon=budget.epsilon, delta=budget.delta, orders_version=budget.orders_version
        )
        committed = tuple(ledger.zero_curve())
        for entry in entries:
            entry.prev_hash = previous
            entry.hash = previous = ledger.entry_hash(entry)
            if entry.kind == "COMMIT":
                committed = privacy.add_curves(committed, entry.curve)
        budget.last_hash, budget.committed = previous, list(committed)
    # the remainder RELEASE no longer equals reservation minus commit
    assert _codes(verify_ledger(database)) == {"curve-mismatch"}


def test_release_after_touch_is_a_lifecycle_problem(database: Database) -> None:
    dataset_id = budgeted_dataset(database)
    job_id = _submit(database, dataset_id)
    _claim(database, job_id)

    def bypass(s: Session, budget: PrivacyBudget, job: Job) -> None:
        job.status = "cancelled"
        budget.reserved = ledger.zero_curve()
        ledger._append(
            s, budget, kind=ledger.RELEASE, job_id=job.id, event=None, curve=list(job.reserved_curve), actor="w"
        )

    with pytest.raises(ledger.LedgerStateError):
        _locked(database, job_id, lambda s, b, j: ledger.release(s, b, job=j, actor="w", reason="x"))
    _locked(database, job_id, bypass)
    report = verify_ledger(database)
    assert [(p.seq, p.code) for p in report.problems] == [(3, "lifecycle")], format_report(report)


def test_commit_above_reservation_is_detected(database: Database) -> None:
    dataset_id = budgeted_dataset(database)
    job_id = _submit(database, dataset_id)
    _claim(database, job_id)
    bigger = _event(steps=200)

    def bypass(s: Session, budget: PrivacyBudget, job: Job) -> None:
        curve = privacy.rdp_curve(privacy.event_from_json(bigger))
        budget.committed = list(privacy.add_curves(budget.committed, curve))
        budget.reserved = ledger.zero_curve()
        ledger._append(s, budget, kind=ledger.COMMIT, job_id=job.id, event=bigger, curve=list(curve), actor="w")
        job.status = "succeeded"

    _locked(database, job_id, bypass)
    assert _codes(verify_ledger(database)) == {"commit-exceeds-reservation"}


def _adjust(db: Database, dataset_id: str, *, epsilon_to: float) -> None:
    """An owner's budget raise, as docs/privacy-model.md#budget-raise asks: its own entry, then the row."""
    with db.write_transaction() as s:
        budget = ledger.lock_budget(s, dataset_id)
        details = {
            "epsilon_from": budget.epsilon,
            "epsilon_to": epsilon_to,
            "delta_from": budget.delta,
            "delta_to": budget.delta,
        }
        ledger._append(
            s, budget, kind=ledger.ADJUST, job_id=None, event=None, curve=None, actor="owner", details=details
        )
        budget.epsilon = epsilon_to


def test_adjust_raises_the_budget_for_later_admissions(database: Database) -> None:
    dataset_id = budgeted_dataset(database, epsilon=1.0)
    with pytest.raises(ledger.InsufficientBudget):
        _submit(database, dataset_id, sigma=0.7, steps=1000)
    _adjust(database, dataset_id, epsilon_to=50.0)
    _submit(database, dataset_id, sigma=0.7, steps=1000)
    assert verify_ledger(database).ok
    # a later raise without its ADJUST entry is reported
    _tamper(database, update(PrivacyBudget).where(PrivacyBudget.dataset_id == dataset_id).values(epsilon=80.0))
    assert _codes(verify_ledger(database)) == {"adjust-mismatch"}


def test_reservation_before_the_raise_is_replayed_against_the_old_budget(database: Database) -> None:
    """A RESERVE that bypassed the filter, 'covered' by a later raise: the final state fits, the past did not."""
    dataset_id = budgeted_dataset(database, epsilon=1.0)
    job_id = _submit(database, dataset_id, sigma=5.0, steps=10)
    big = _event(sigma=0.7, steps=1000)

    def bypass(s: Session, budget: PrivacyBudget, job: Job) -> None:
        big_job = Job(
            tenant_id=job.tenant_id,
            dataset_id=dataset_id,
            spec={},
            algorithm="dp-sgd",
            model_name="m",
            noise_multiplier=0.7,
            sampling_probability=Q,
            steps_planned=1000,
            delta=1e-5,
            epsilon_ledger=9.0,
            event=big,
            reserved_curve=list(privacy.rdp_curve(privacy.event_from_json(big))),
        )
        s.add(big_job)
        s.flush()
        budget.reserved = list(privacy.add_curves(budget.reserved, big_job.reserved_curve))
        ledger._append(
            s, budget, kind=ledger.RESERVE, job_id=big_job.id, event=big, curve=big_job.reserved_curve, actor="x"
        )

    _locked(database, job_id, bypass)
    _adjust(database, dataset_id, epsilon_to=50.0)
    report = verify_ledger(database)
    assert [(p.seq, p.code) for p in report.problems] == [(2, "inadmissible-reservation")], format_report(report)


def test_raw_sql_deletion_of_all_entries_is_detected(database: Database, built: Built) -> None:
    with database.write_transaction() as s:
        s.execute(text("DELETE FROM ledger_entries WHERE dataset_id = :d"), {"d": built.other_dataset_id})
    report = verify_ledger(database, dataset_id=built.other_dataset_id)
    assert _codes(report) == {"budget-head-mismatch", "lifecycle", "unsettled-terminal-job"}
    assert report.entries_checked == 0


@pytest.mark.parametrize(
    ("column", "value"),
    [("curve", [1.0, 2.0]), ("curve", "oops"), ("curve", [-1.0] * len(privacy.ORDERS)), ("event", {"schema": "x"})],
)
def test_garbage_is_reported_not_raised(database: Database, built: Built, column: str, value: Any) -> None:
    commit = _entry(database, built.dataset_id, kind="COMMIT", job_id=built.succeeded)
    _tamper(database, update(LedgerEntry).where(LedgerEntry.id == commit.id).values({column: value}))
    report = verify_ledger(database)
    assert {"hash-mismatch", "malformed-entry"} <= _codes(report)
    assert (commit.seq, "malformed-entry") in {(p.seq, p.code) for p in report.problems}


def test_second_touch_and_late_remainder_are_lifecycle_problems(database: Database) -> None:
    dataset_id = budgeted_dataset(database)
    first, second = _submit(database, dataset_id), _submit(database, dataset_id)
    _claim(database, first)
    _claim(database, second)
    partial = _event(steps=40)

    def bypass(s: Session, budget: PrivacyBudget, job: Job) -> None:
        ledger._append(s, budget, kind=ledger.TOUCH, job_id=job.id, event=None, curve=None, actor="w")
        curve = privacy.rdp_curve(privacy.event_from_json(partial))
        budget.committed = list(privacy.add_curves(budget.committed, curve))
        budget.reserved = ledger._reserved_of_other_open_jobs(s, dataset_id, job.id)
        ledger._append(s, budget, kind=ledger.COMMIT, job_id=job.id, event=partial, curve=list(curve), actor="w")
        ledger._append(s, budget, kind=ledger.TOUCH, job_id=second, event=None, curve=None, actor="w")
        remainder = privacy.subtract_curves(job.reserved_curve, curve)
        ledger._append(s, budget, kind=ledger.RELEASE, job_id=job.id, event=None, curve=list(remainder), actor="w")
        job.status = "succeeded"

    _locked(database, first, bypass)  # seq 5: 2nd TOUCH of first, 6: COMMIT, 7: 2nd TOUCH of second, 8: RELEASE
    report = verify_ledger(database)
    assert [(p.seq, p.code) for p in report.problems] == [(5, "lifecycle"), (7, "lifecycle"), (8, "lifecycle")]
