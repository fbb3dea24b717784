"""The ledger's lifecycle rules and hash chain, at the database level."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel import privacy
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger
from tests.ledger_fixtures import budgeted_dataset


def _job(db: Database, dataset_id: str, sigma: float = 1.0, steps: int = 100) -> str:
    event = privacy.PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=sigma, count=steps)
    with db.write_transaction() as s:
        tenant_id = s.get(Dataset, dataset_id).tenant_id
        job = Job(
            tenant_id=tenant_id,
            dataset_id=dataset_id,
            spec={},
            algorithm="dp-sgd",
            model_name="m",
            noise_multiplier=sigma,
            sampling_probability=0.01,
            steps_planned=steps,
            delta=1e-5,
            epsilon_ledger=1.0,
            event=privacy.event_to_json(event),
            reserved_curve=list(privacy.rdp_curve(event)),
        )
        s.add(job)
        s.flush()
        ledger.reserve(s, ledger.lock_budget(s, dataset_id), job=job, actor="test")
        return job.id


def _with_job(
    db: Database, dataset_id: str, job_id: str, action: Callable[[Session, PrivacyBudget, Job], object]
) -> None:
    with db.write_transaction() as s:
        budget = ledger.lock_budget(s, dataset_id)
        job = s.get(Job, job_id)
        assert job is not None
        action(s, budget, job)


def test_chain_links_every_entry(database: Database) -> None:
    dataset_id = budgeted_dataset(database)
    first, second = _job(database, dataset_id), _job(database, dataset_id)
    _with_job(database, dataset_id, first, lambda s, b, j: ledger.touch(s, b, job=j, actor="w"))
    _with_job(
        database,
        dataset_id,
        first,
        lambda s, b, j: (
            ledger.commit(s, b, job=j, actual_event=j.event, actor="w", reason="ok"),
            setattr(j, "status", "succeeded"),
        ),
    )
    _with_job(
        database,
        dataset_id,
        second,
        lambda s, b, j: (setattr(j, "status", "cancelled"), ledger.release(s, b, job=j, actor="a", reason="cancel")),
    )
    with database.read_session() as s:
        entries = list(
            s.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id).order_by(LedgerEntry.seq))
        )
        budget = ledger.lock_budget(s, dataset_id)
    assert [e.kind for e in entries] == ["RESERVE", "RESERVE", "TOUCH", "COMMIT", "RELEASE"]
    previous = ledger.genesis_hash(dataset_id, epsilon=8.0, delta=1e-5, orders_version=privacy.ORDERS_VERSION)
    for entry in entries:
        assert entry.prev_hash == previous
        assert ledger.entry_hash(entry) == entry.hash
        previous = entry.hash
    assert budget.last_hash == previous and budget.entry_count == 5
    assert budget.reserved == [0.0] * len(privacy.ORDERS)  # exactly zero once nothing is open
    zeros = tuple(ledger.zero_curve())
    assert entries[1].details["admitted_against"]["reserved"] == list(
        privacy.add_curves(zeros, tuple(entries[0].curve))
    )
    # tampering with any field changes the hash
    entries[3].curve = [v / 2 for v in entries[3].curve]
    assert ledger.entry_hash(entries[3]) != entries[3].hash


def test_lifecycle_rules(database: Database) -> None:
    dataset_id = budgeted_dataset(database)
    job_id = _job(database, dataset_id)
    _with_job(database, dataset_id, job_id, lambda s, b, j: ledger.touch(s, b, job=j, actor="w"))
    with pytest.raises(ledger.LedgerStateError):
        _with_job(database, dataset_id, job_id, lambda s, b, j: ledger.touch(s, b, job=j, actor="w"))
    with pytest.raises(ledger.LedgerStateError):  # once touched, a job must commit
        _with_job(database, dataset_id, job_id, lambda s, b, j: ledger.release(s, b, job=j, actor="w", reason="x"))
    bigger = privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=0.5, count=100)
    )
    with pytest.raises(ledger.LedgerStateError):  # actual cost above the reservation
        _with_job(
            database,
            dataset_id,
            job_id,
            lambda s, b, j: ledger.commit(s, b, job=j, actual_event=bigger, actor="w", reason="x"),
        )
    partial = privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=1.0, count=40)
    )
    _with_job(
        database,
        dataset_id,
        job_id,
        lambda s, b, j: ledger.commit(s, b, job=j, actual_event=partial, actor="w", reason="cancelled"),
    )
    with pytest.raises(ledger.LedgerStateError):
        _with_job(
            database,
            dataset_id,
            job_id,
            lambda s, b, j: ledger.commit(s, b, job=j, actual_event=partial, actor="w", reason="again"),
        )
    with database.read_session() as s:
        kinds = list(s.scalars(select(LedgerEntry.kind).order_by(LedgerEntry.seq)))
        summary = ledger.budget_summary(s.get(ledger.PrivacyBudget, dataset_id))
    assert kinds == ["RESERVE", "TOUCH", "COMMIT", "RELEASE"]  # failed transitions wrote nothing
    expected = privacy.ledger_epsilon(privacy.rdp_curve(privacy.event_from_json(partial)), 1e-5)
    assert summary["committed_epsilon"] == pytest.approx(expected)
    assert summary["reserved_epsilon"] == 0.0


def test_over_budget_reservation_writes_nothing(database: Database) -> None:
    dataset_id = budgeted_dataset(database, epsilon=0.5)
    with pytest.raises(ledger.InsufficientBudget) as raised:
        _job(database, dataset_id, sigma=0.6, steps=1000)
    assert 0 <= raised.value.remaining_epsilon <= 0.5
    with database.read_session() as s:
        assert s.scalars(select(LedgerEntry)).all() == [] and s.scalars(select(Job)).all() == []


def test_editing_the_budget_row_breaks_the_chain_anchor(database: Database) -> None:
    from sqlalchemy import update

    from kernel.ledger.audit import verify_ledger

    dataset_id = budgeted_dataset(database)
    _job(database, dataset_id)
    assert verify_ledger(database).ok
    with database.write_transaction() as s:
        s.execute(
            update(ledger.PrivacyBudget).where(ledger.PrivacyBudget.dataset_id == dataset_id).values(epsilon=80.0)
        )
    codes = {p.code for p in verify_ledger(database).problems}
    assert "broken-chain" in codes


def test_an_edited_job_row_cannot_free_budget(database: Database) -> None:
    """Reserved totals come from the hashed RESERVE entries, not from the editable jobs table."""
    from sqlalchemy import update

    dataset_id = budgeted_dataset(database)
    first, second = _job(database, dataset_id), _job(database, dataset_id)
    with database.write_transaction() as s:  # an attacker marks the first job finished and cheap
        s.execute(
            update(Job).where(Job.id == first).values(status="succeeded", reserved_curve=[0.0] * len(privacy.ORDERS))
        )
    _with_job(
        database,
        dataset_id,
        second,
        lambda s, b, j: (setattr(j, "status", "cancelled"), ledger.release(s, b, job=j, actor="a", reason="x")),
    )
    with database.read_session() as s:
        budget = s.get(ledger.PrivacyBudget, dataset_id)
        first_reserve = s.scalar(
            select(LedgerEntry.curve).where(LedgerEntry.job_id == first, LedgerEntry.kind == "RESERVE")
        )
    assert budget.reserved == list(privacy.add_curves(tuple(ledger.zero_curve()), tuple(first_reserve)))  # still held
