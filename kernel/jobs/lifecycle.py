"""A job's life, one function per transition: admit, claim, progress, succeed, stop early,
fail, cancel, requeue-or-fail (and the dispatch mark the reconciler reads).

The API (submit, cancel), the worker (claim to settlement) and the reconciler call these
functions; none of them writes a job's status, its ledger entries or its events by hand. Each
transition is one write transaction that locks the dataset's budget row first
(:func:`kernel.ledger.operations.lock_budget`), re-reads the job and checks its current state, then writes the
ledger entry, the job's status and the job's event together: the job row and the ledger can
never disagree, and a transition whose precondition no longer holds (a duplicate message, a stale
attempt, a job that already ended) writes nothing. ``kernel.ledger.operations`` stays the ledger's storage and
arithmetic; this module decides which entry a transition writes.

The privacy rules of the lifecycle (docs/privacy-model.md §7 says what each view then shows):

* **Admission reserves the worst case.** A job is admitted through the Rényi filter against the
  budget's committed and reserved curves, and RESERVEs the curve of the whole planned run,
  evaluation included. A job that does not fit writes nothing.
* **TOUCH when a worker opens the data.** The first claim writes TOUCH before any row is read.
  From then on the job pays for what it runs even if it fails: it can only COMMIT, never RELEASE
  its whole reservation. A retried attempt runs inside the same reservation and never reserves
  or touches again.
* **Commit what actually ran.** A job that succeeds commits the event of the steps it ran plus
  its released evaluation; one stopped early (cancelled while running, or a budget-unit
  algorithm that ended by itself) commits the steps it ran, with no evaluation released. The
  unused part of the reservation is RELEASEd in the same transaction.
* **Release the rest.** A job cancelled or refused before TOUCH releases its whole reservation
  and spent nothing (ε 0). A job that fails after TOUCH commits its whole reservation: what a
  failed attempt ran is not known exactly, so the worst case is charged.
* **A worker that died.** The reconciler finds running jobs whose heartbeat is older than
  ``stale_after_s``. While attempts remain (and no cancel was asked for) the job goes back to the
  queue inside its reservation, keeping its TOUCH; after the last attempt it fails with
  ``worker-lost`` and commits its whole reservation. A queued job cancelled after such a lost
  attempt also commits its whole reservation.

* **Every ε spent has a report.** The transition that commits a charge stores the job's privacy
  report in the same transaction: a success's (the worker builds it), or, for a job that ends
  otherwise having committed ε (cancelled while running, failed or lost after TOUCH, cancelled
  after a lost attempt), an ``EndedReportWriter``'s (kernel.reporting.ended_report: no model, what
  it committed and why it ended). That transition also replaces the planned run's single-job ε
  on the job row with the committed event's. The report is built under the lock but uploaded
  after the commit (kernel/jobs/report_outbox.py): nothing slow holds the budget row. A report
  that cannot be built is logged and never blocks the charge. A job that committed nothing has no
  report.

* **Public datasets have no ledger.** A dataset its owner declared public keeps its budget row
  only as the lock every transition takes; no transition writes a ledger entry for its jobs, and
  every job on it ends with ``epsilon_committed = 0`` (docs/pretraining-and-finetuning.md).
  Non-private optimizers are admitted on public datasets only.

Events carry public values only (docs/privacy-model.md §1); errors are generic codes.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, object_session

from kernel.datasets.status import require_active
from kernel.db.changed_rows import changed_rows
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget, Tenant, utcnow
from kernel.errors import InvalidInput
from kernel.jobs import report_outbox
from kernel.jobs.events import add_job_event
from kernel.jobs.refusals import ActiveJobLimitReached, BudgetExhausted, JobNotCancellable
from kernel.jobs.status import ACTIVE_STATUSES, TERMINAL_STATUSES, JobEventKind, JobStatus
from kernel.ledger import operations as ledger
from kernel.ledger.budget_change import budget_without_job
from kernel.schemas.stored_spec import stored_spec

if TYPE_CHECKING:  # planning loads the catalogues; the reconciler needs none of them
    from kernel.jobs.planning import JobPlan

__all__ = [
    "ACTIVE_STATUSES",
    "RECONCILER_ACTOR",
    "TERMINAL_STATUSES",
    "ActiveJobLimitReached",
    "Attempt",
    "BudgetExhausted",
    "CommitRecord",
    "EndedReport",
    "EndedReportWriter",
    "JobNotCancellable",
    "JobStatus",
    "Success",
    "admit",
    "cancel",
    "cancel_within",
    "claim",
    "fail",
    "mark_dispatched",
    "record_progress",
    "requeue_or_fail",
    "stop_early",
    "succeed",
]

log = logging.getLogger("privtrain.lifecycle")

RECONCILER_ACTOR = "reconciler"


# ---------------------------------------------------------------------------------- locks


def _lock(tx: Session, dataset_id: str) -> tuple[PrivacyBudget, bool]:
    """Lock the dataset's budget row (every transition's lock) and say whether the dataset is
    public: then no ledger entry is written for its jobs."""
    budget = ledger.lock_budget(tx, dataset_id)
    public = bool(tx.scalar(select(Dataset.public).where(Dataset.id == dataset_id)))
    return budget, public


def _end_without_ledger(job: Job) -> None:
    """A job on a public dataset ends having spent nothing: there is no budget to charge."""
    job.epsilon_committed = 0.0


# ---------------------------------------------------------------------------------- admit


def _check_active_job_limit(tx: Session, tenant_id: str, limit: int) -> None:
    """Serialised per tenant (its row is locked), so concurrent submissions cannot overshoot."""
    tx.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
    active = (
        tx.scalar(
            select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id, Job.status.in_(ACTIVE_STATUSES))
        )
        or 0
    )
    if active >= limit:
        raise ActiveJobLimitReached(active=active, limit=limit)


def _new_job(
    plan: JobPlan, *, tenant_id: str, dataset_id: str, idempotency_key: str | None, request_hash: str, queue: str | None
) -> Job:
    return Job(
        queue=queue,
        tenant_id=tenant_id,
        dataset_id=dataset_id,
        status=JobStatus.QUEUED,
        spec=plan.spec,
        algorithm=plan.algorithm.name,
        model_name=plan.model_name,
        noise_multiplier=plan.noise_multiplier,
        sampling_probability=plan.plan.sampling_probability,
        steps_planned=plan.plan.steps,
        delta=plan.delta,
        epsilon_ledger=plan.epsilon_ledger,
        epsilon_prv=plan.epsilon_prv,
        event=plan.event_json,
        reserved_curve=list(plan.curve),
        idempotency_key=idempotency_key,
        request_hash=request_hash,
    )


def admit(
    db: Database,
    *,
    plan: JobPlan,
    tenant_id: str,
    dataset_id: str,
    actor: str,
    max_active_jobs: int,
    idempotency_key: str | None,
    request_hash: str,
    recheck_access: Callable[[Session], object],
    queue: str | None = None,
    with_job: Callable[[Session, Job], object] | None = None,
) -> Job:
    """(new) → queued: RESERVE the plan's worst case and record the ``queued`` event.

    ``with_job`` adds rows that belong to the job in the same transaction (a tuning's record), so
    a refused admission leaves none of them behind.

    ``recheck_access`` runs under the budget lock, which grants and revokes also take: a revoke
    that committed while the request was planning wins (kernel/access/grants.py). Raises
    :class:`ActiveJobLimitReached` or :class:`BudgetExhausted`; an idempotency key already used
    by a concurrent submission surfaces as the database's IntegrityError (kernel.db.idempotency).
    """
    with db.write_transaction() as tx:
        budget, public = _lock(tx, dataset_id)
        dataset = tx.get(Dataset, dataset_id, populate_existing=True)
        assert dataset is not None
        require_active(dataset)  # a deletion that committed while the request was planning wins
        if public != plan.public_dataset or (not public and not plan.algorithm.private):
            raise InvalidInput(  # planned against another view of the dataset: never admit it unpriced
                slug="non-private-on-private-data",
                detail="the job was planned for a public dataset but this one is not (or the reverse); submit it again",
            )
        recheck_access(tx)
        _check_active_job_limit(tx, tenant_id, max_active_jobs)
        job = _new_job(
            plan,
            tenant_id=tenant_id,
            dataset_id=dataset_id,
            idempotency_key=idempotency_key,
            request_hash=request_hash,
            queue=queue,
        )
        tx.add(job)
        tx.flush()
        if with_job is not None:
            with_job(tx, job)
        witness_order = None
        if not public:
            try:
                witness_order = ledger.reserve(tx, budget, job=job, actor=actor).witness_order
            except ledger.InsufficientBudget as exc:
                raise BudgetExhausted(job=job, budget=budget, remaining_epsilon=exc.remaining_epsilon) from None
        add_job_event(
            tx,
            job.id,
            JobEventKind.QUEUED,
            {"steps_planned": job.steps_planned, "witness_order": witness_order},
        )
    return job


def mark_dispatched(db: Database, job_id: str) -> None:
    """Remember when the job's message was last sent, so the reconciler re-sends lost ones."""
    with db.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job_id).values(dispatched_at=utcnow()))


# ---------------------------------------------------------------------------------- the worker


@dataclass(frozen=True)
class Attempt:
    """One worker's hold on a job: only this attempt may move it on while it is running."""

    job_id: str
    dataset_id: str
    number: int


def _settle_failed(
    tx: Session,
    budget: PrivacyBudget,
    job: Job,
    *,
    error_code: str,
    actor: str,
    public: bool,
    write_report: EndedReportWriter | None,
) -> LedgerEntry | None:
    """After TOUCH the data was opened: commit the full reservation (and store its report). Before
    it: release it."""
    record: CommitRecord | None = None
    entry: LedgerEntry | None
    if public:
        entry = None
        _end_without_ledger(job)
    elif job.touched_at is not None:
        record = _commit(tx, budget, job, actual_event=job.event, actor=actor, reason=f"failed: {error_code}")
        entry = record.commit_entry
    else:
        entry = ledger.release(tx, budget, job=job, actor=actor, reason=f"failed: {error_code}")
    job.status = JobStatus.FAILED
    job.error_code = error_code
    job.finished_at = utcnow()
    reported = _store_ended_report(record, write_report)
    add_job_event(tx, job.id, JobEventKind.FAILED, {"error_code": error_code, **reported})
    return entry


def _commit(
    tx: Session, budget: PrivacyBudget, job: Job, *, actual_event: dict[str, Any], actor: str, reason: str
) -> CommitRecord:
    """COMMIT ``actual_event`` (RELEASE the rest) and read the ledger around it, as a report states it."""
    committed_before = list(budget.committed)
    entry = ledger.commit(tx, budget, job=job, actual_event=actual_event, actor=actor, reason=reason)
    tx.flush()
    return CommitRecord(
        job=job,
        commit_entry=entry,
        budget_before=budget_without_job(budget, committed_before=committed_before, commit_entry=entry),
        budget_after=ledger.budget_summary(budget),
        adjustments=ledger.adjustments(tx, job.dataset_id),
    )


def _store_ended_report(record: CommitRecord | None, write_report: EndedReportWriter | None) -> dict[str, bool]:
    """The report of a job that ended without success having committed ε (``record``), stored
    with the single-job ε of what it committed; the event payload that says a report exists."""
    if record is None:
        return {}
    if write_report is None:  # only tests settle jobs without a writer; every service path passes one
        log.warning("a job committed ε without a report writer", extra={"job_id": record.job.id})
        return {}
    try:
        ended = write_report(record)
        tx = object_session(record.job)
        assert tx is not None  # the settling transaction's job
        record.job.report_blob = report_outbox.stage(tx, job_id=record.job.id, report=ended.report)
    except Exception:  # the charge must be recorded even if its report cannot be: never block a settlement
        log.exception("the report of a job that committed ε could not be stored", extra={"job_id": record.job.id})
        return {}
    record.job.epsilon_prv = ended.single_job_epsilon
    return {"report": True}


def claim(
    db: Database,
    *,
    job_id: str,
    dataset_id: str,
    actor: str,
    refusal: str | None = None,
    write_report: EndedReportWriter | None = None,
) -> Job | None:
    """queued → running (attempt + 1), TOUCH on the first attempt, and the ``started`` event.

    None when the job is not claimable (a duplicate or late message, a cancel asked for). With a
    ``refusal`` (an error code: the worker could not re-derive the job's charge, or its spec does
    not fit its model) the claimed job fails at once instead, before any data is opened by this
    attempt (a retried attempt's job was touched before: it commits, with ``write_report``'s report).
    """
    with db.write_transaction() as tx:
        budget, public = _lock(tx, dataset_id)
        claimed = changed_rows(
            tx,
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.QUEUED, Job.cancel_requested.is_(False))
            .values(status=JobStatus.RUNNING, attempt=Job.attempt + 1, started_at=utcnow(), heartbeat_at=utcnow()),
        )
        if claimed != 1:
            return None
        job = tx.get(Job, job_id, populate_existing=True)
        assert job is not None
        if refusal is not None:
            _settle_failed(tx, budget, job, error_code=refusal, actor=actor, public=public, write_report=write_report)
            return None
        if job.touched_at is None:
            if not public:
                ledger.touch(tx, budget, job=job, actor=actor)
            job.touched_at = utcnow()
        add_job_event(tx, job.id, JobEventKind.STARTED, {"attempt": job.attempt, "steps_planned": job.steps_planned})
    return job


def heartbeat(db: Database, *, attempt: Attempt) -> bool:
    """Heartbeat without a progress event (a worker busy outside its training loop, e.g. computing
    a cancelled job's single-job ε); True when the worker should stop, as for :func:`record_progress`."""
    with db.write_transaction() as tx:
        mine = changed_rows(
            tx,
            update(Job)
            .where(Job.id == attempt.job_id, Job.status == JobStatus.RUNNING, Job.attempt == attempt.number)
            .values(heartbeat_at=utcnow()),
        )
        if mine != 1:
            return True
        current = tx.get(Job, attempt.job_id, populate_existing=True)
        return bool(current is not None and current.cancel_requested)


def record_progress(db: Database, *, attempt: Attempt, step: int, steps_planned: int, epsilon_spent: float) -> bool:
    """Heartbeat and ``progress`` event; True when the worker should stop (a cancel was asked
    for, or this attempt no longer owns the job: a newer attempt does, or it was settled)."""
    with db.write_transaction() as tx:
        mine = changed_rows(
            tx,
            update(Job)
            .where(Job.id == attempt.job_id, Job.status == JobStatus.RUNNING, Job.attempt == attempt.number)
            .values(steps_run=step, heartbeat_at=utcnow()),
        )
        if mine != 1:
            return True
        add_job_event(
            tx,
            attempt.job_id,
            JobEventKind.PROGRESS,
            {"step": step, "steps_planned": steps_planned, "epsilon_spent": epsilon_spent},
        )
        current = tx.get(Job, attempt.job_id, populate_existing=True)
        return bool(current is not None and current.cancel_requested)


def _lock_own_job(tx: Session, attempt: Attempt) -> tuple[PrivacyBudget, Job, bool] | None:
    """Lock the budget and re-read the job; None if this attempt no longer owns it. The flag
    says whether the dataset is public (no ledger entries)."""
    budget, public = _lock(tx, attempt.dataset_id)
    job = tx.get(Job, attempt.job_id, populate_existing=True)
    assert job is not None
    if job.status != JobStatus.RUNNING or job.attempt != attempt.number:
        return None
    return budget, job, public


@dataclass(frozen=True)
class Success:
    """What a finished run releases, stored before the commit (blobs are content-addressed)."""

    steps_run: int
    actual_event: dict[str, Any]
    """The event of the steps run and the released evaluation: what the job commits."""
    model_blob: str
    model_sha256: str
    metrics: dict[str, Any] | None
    epsilon_prv: float
    """The single-job ε of ``actual_event`` (numeric accountants): replaces the closed-form one
    computed at submission, so the job and its report state one number."""
    selected: SelectedTrial | None = None
    """A tuning's selected configuration: the job's spec and mechanism become the released trial's."""


@dataclass(frozen=True)
class SelectedTrial:
    """What a tuning releases about its best trial (public: a configuration of its public pool)."""

    spec: dict[str, Any]
    noise_multiplier: float
    sampling_probability: float
    steps: int


@dataclass(frozen=True)
class CommitRecord:
    """The ledger around a success's COMMIT, as its report states it (read in the same transaction)."""

    job: Job
    commit_entry: LedgerEntry | None
    """None on a public dataset (no ledger); so are the budgets."""
    budget_before: dict[str, Any] | None
    budget_after: dict[str, Any] | None
    adjustments: list[dict[str, Any]]


ReportWriter = Callable[[CommitRecord], dict[str, Any]]
"""Builds the job's report from its commit, inside the settling transaction: nothing slow (what
takes time is computed before). The transaction stages it; it is uploaded after the commit
(kernel/jobs/report_outbox.py)."""


@dataclass(frozen=True)
class EndedReport:
    """The report an :data:`EndedReportWriter` built, and the single-job ε it states."""

    report: dict[str, Any]
    single_job_epsilon: float
    """The single-job ε of the committed event: replaces the planned run's on the job row."""


EndedReportWriter = Callable[[CommitRecord], EndedReport]
"""Builds the report of a job that ended without success having committed ε, from its commit (the
job's status and error code already set), staged like a success's; kernel.reporting.ended_report
makes them."""


def succeed(db: Database, *, attempt: Attempt, success: Success, actor: str, write_report: ReportWriter) -> bool:
    """running → succeeded: COMMIT the event run (RELEASE the rest), store the report, record the
    ``succeeded`` event. False (nothing written) when this attempt no longer owns the job."""
    with db.write_transaction() as tx:
        owned = _lock_own_job(tx, attempt)
        if owned is None:
            return False
        budget, job, public = owned
        job.steps_run = success.steps_run
        if success.selected is not None:
            job.spec = success.selected.spec
            job.noise_multiplier = success.selected.noise_multiplier
            job.sampling_probability = success.selected.sampling_probability
            job.steps_planned = success.selected.steps
        if public:
            _end_without_ledger(job)
            record = CommitRecord(job=job, commit_entry=None, budget_before=None, budget_after=None, adjustments=[])
        else:
            record = _commit(tx, budget, job, actual_event=success.actual_event, actor=actor, reason="succeeded")
        report_key = report_outbox.stage(tx, job_id=job.id, report=write_report(record))
        job.status = JobStatus.SUCCEEDED
        job.epsilon_prv = None if public else success.epsilon_prv
        job.metrics = success.metrics
        job.model_blob, job.model_sha256, job.report_blob = success.model_blob, success.model_sha256, report_key
        job.finished_at = utcnow()
        add_job_event(
            tx, job.id, JobEventKind.SUCCEEDED, {"steps_run": success.steps_run, "epsilon_spent": job.epsilon_committed}
        )
    return True


def stop_early(
    db: Database,
    *,
    attempt: Attempt,
    steps_run: int,
    actual_event: dict[str, Any],
    actor: str,
    write_report: EndedReportWriter | None = None,
) -> bool:
    """running → cancelled after TOUCH: commit the steps that ran (no evaluation was released),
    release the rest, store ``write_report``'s report. False (nothing written) when this attempt
    no longer owns the job."""
    with db.write_transaction() as tx:
        owned = _lock_own_job(tx, attempt)
        if owned is None:
            return False
        budget, job, public = owned
        job.steps_run = steps_run
        record = None
        if public:
            _end_without_ledger(job)
        else:
            record = _commit(tx, budget, job, actual_event=actual_event, actor=actor, reason="cancelled")
        job.status = JobStatus.CANCELLED
        job.finished_at = utcnow()
        reported = _store_ended_report(record, write_report)
        add_job_event(tx, job.id, JobEventKind.CANCELLED, {"steps_run": steps_run, **reported})
    return True


def fail(
    db: Database, *, attempt: Attempt, error_code: str, actor: str, write_report: EndedReportWriter | None = None
) -> bool:
    """running → failed: commit the whole reservation (the data was opened) and store
    ``write_report``'s report. False (nothing written) when this attempt no longer owns the job."""
    with db.write_transaction() as tx:
        owned = _lock_own_job(tx, attempt)
        if owned is None:
            return False
        budget, job, public = owned
        _settle_failed(tx, budget, job, error_code=error_code, actor=actor, public=public, write_report=write_report)
    return True


# ---------------------------------------------------------------------------------- cancel


def cancel(
    db: Database, *, job_id: str, dataset_id: str, actor: str, write_report: EndedReportWriter | None = None
) -> Job:
    """Cancel under the dataset's budget lock and return the job as it now is.

    The caller has checked that its tenant may cancel the job (``kernel.access.roles.job_for(need="cancel")``);
    ``POST /v1/jobs/{id}/cancel`` and the dashboard's button both come here, so the two can never
    settle a cancelled job's budget differently. A queued job ends at once: its reservation goes
    back to the budget, unless a lost attempt already opened the data (requeued), in which case
    the whole reservation is committed, as for a crash (with ``write_report``'s report). A running
    job gets ``cancel_requested`` and stops at its next step (the worker settles it with
    :func:`stop_early`). A running private tuning ends at once, committing its whole reservation
    (as it would however it ended) with ``write_report``'s report: when its workers notice depends
    on what its slots were doing, which must not show (kernel/tuning/slots.py). Raises
    :class:`JobNotCancellable` for a job that has already ended.
    """
    with db.write_transaction() as tx:
        return cancel_within(tx, job_id=job_id, dataset_id=dataset_id, actor=actor, write_report=write_report)


def cancel_within(
    tx: Session,
    *,
    job_id: str,
    dataset_id: str,
    actor: str,
    reason: str | None = None,
    write_report: EndedReportWriter | None = None,
) -> Job:
    """:func:`cancel` inside the caller's write transaction: a dataset's deletion cancels all its
    jobs in the transaction that marks it (kernel/datasets/deletion.py). ``reason`` (a public code,
    e.g. ``dataset-deleted``) goes into the cancel events."""
    budget, public = _lock(tx, dataset_id)
    cancelled_queued = changed_rows(
        tx,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.CANCELLED, cancel_requested=True, finished_at=utcnow()),
    )
    job = tx.get(Job, job_id, populate_existing=True)
    assert job is not None
    why = {"reason": reason} if reason is not None else {}
    if cancelled_queued == 1 and public:
        _end_without_ledger(job)
        add_job_event(tx, job.id, JobEventKind.CANCELLED, {"steps_run": job.steps_run, **why})
    elif cancelled_queued == 1 and job.touched_at is None:
        ledger.release(tx, budget, job=job, actor=actor, reason="cancelled before start")
        add_job_event(tx, job.id, JobEventKind.CANCELLED, {"steps_run": 0, **why})
    elif cancelled_queued == 1:
        # Requeued after a lost worker: the data was opened and the lost attempt's steps are
        # not known exactly, so the whole reservation is committed, as for a crash.
        record = _commit(tx, budget, job, actual_event=job.event, actor=actor, reason="cancelled after a lost attempt")
        reported = _store_ended_report(record, write_report)
        add_job_event(tx, job.id, JobEventKind.CANCELLED, {"steps_run": job.steps_run, **why, **reported})
    elif job.status == JobStatus.RUNNING and _is_tuning(job):
        job.cancel_requested = True
        job.status = JobStatus.CANCELLED
        job.finished_at = utcnow()
        record = _commit(tx, budget, job, actual_event=job.event, actor=actor, reason="cancelled")
        reported = _store_ended_report(record, write_report)
        add_job_event(tx, job.id, JobEventKind.CANCELLED, {"steps_run": 0, **why, **reported})
    elif job.status == JobStatus.RUNNING:
        job.cancel_requested = True
        add_job_event(tx, job.id, JobEventKind.CANCEL_REQUESTED, why)
    else:
        raise JobNotCancellable(job.status)
    return job


def _is_tuning(job: Job) -> bool:
    """A private tuning's job (kernel/tuning/planning.py): its whole reservation is its charge."""
    return stored_spec(job).is_tuning


# ---------------------------------------------------------------------------------- reconciler


def requeue_or_fail(
    db: Database,
    *,
    job_id: str,
    dataset_id: str,
    attempt: int,
    stale_before: dt.datetime,
    max_attempts: int,
    write_report: EndedReportWriter | None = None,
) -> JobStatus | None:
    """A running job whose worker stopped beating: back to the queue inside its reservation while
    attempts remain, else failed (``worker-lost``, whole reservation committed, ``write_report``'s
    report stored). Returns the status
    the job moved to; None when nothing was done (staleness is checked again under the lock: the
    worker may be back)."""
    with db.write_transaction() as tx:
        budget, public = _lock(tx, dataset_id)
        job = tx.get(Job, job_id, populate_existing=True)
        if job is None or job.status != JobStatus.RUNNING or job.attempt != attempt:
            return None
        heartbeat = job.heartbeat_at
        if heartbeat is not None and heartbeat.replace(tzinfo=dt.UTC) >= stale_before.replace(tzinfo=dt.UTC):
            return None
        if job.attempt < max_attempts and not job.cancel_requested:
            job.status = JobStatus.QUEUED
            job.dispatched_at = None
            add_job_event(tx, job.id, JobEventKind.REQUEUED, {"attempt": job.attempt, "reason": "worker-lost"})
            return JobStatus.QUEUED
        _settle_failed(
            tx,
            budget,
            job,
            error_code="worker-lost",
            actor=RECONCILER_ACTOR,
            public=public,
            write_report=write_report,
        )
        return JobStatus.FAILED
