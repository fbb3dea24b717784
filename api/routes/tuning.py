"""Private hyperparameter tuning: estimate, create (one ledger entry), view, list, cancel."""

from __future__ import annotations

import hashlib
import json
import logging
import random
import secrets
from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.jobs import init_chain_estimate, job_planner
from api.routes.planning_slots import PlanningSlotDep
from api.routes.routing import ReleasingRoute
from kernel.access.roles import dataset_for, job_for, visible_jobs
from kernel.datasets.stored_facts import facts_of
from kernel.db.idempotency import IdempotentRequest, create_once, earlier
from kernel.db.orm import Dataset, Job, PrivacyBudget, Tenant, TuningJob
from kernel.db.pagination import cursor_id, decode_cursor, encode_cursor
from kernel.errors import NotFound, not_found
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.dispatch import dispatch_with_settings
from kernel.jobs.routing import route_job
from kernel.jobs.status import JobStatus
from kernel.ledger import operations as ledger
from kernel.reporting.ended_report import cancel_report_writer
from kernel.schemas.stored_spec import HasSpec, StoredTuning, stored_spec
from kernel.schemas.tuning import TuningCreate, TuningEstimate, TuningList, TuningOut, TuningSchedule, TuningTrials
from kernel.services import Services
from kernel.tuning import slots as tuning_slots
from kernel.tuning.planning import TuningLimits, TuningPlan, plan_tuning

router = APIRouter(prefix="/v1/tuning-jobs", tags=["tuning"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.tuning")


def _plan(
    services: Services, session: Session, tenant: Tenant, request: TuningCreate
) -> tuple[TuningPlan, PrivacyBudget, str]:
    plan_candidate, dataset, budget = job_planner(services, session, tenant, request.base)
    settings = services.settings
    plan = plan_tuning(
        request,
        dataset,
        plan_candidate=plan_candidate,
        rng=random.Random(secrets.randbits(128)),  # the pool is public: drawn before any data is read
        limits=TuningLimits(
            max_trials=settings.tuning_max_trials,
            slot_margin_s=settings.tuning_slot_margin_s,
            parallel_slots=settings.tuning_parallel_trials,
            max_slot_seconds=settings.job_time_limit_s,
        ),
    )
    return plan, budget, route_job(request.base, plan.carrier, facts_of(dataset), services.settings)


def _trials(tuning: StoredTuning) -> TuningTrials:
    trials = tuning.trials
    return TuningTrials(
        distribution=trials.distribution,
        parameters=dict(trials.parameters),
        expected=trials.mean,
        maximum=trials.maximum,
    )


def _schedule(tuning: StoredTuning, *, slots_done: int) -> TuningSchedule | None:
    stored = tuning.schedule
    if stored is None:
        return None  # admitted before slots existed
    return TuningSchedule(
        slots=stored.slots,
        slots_done=slots_done,
        trial_time_limit_s=stored.trial_time_limit_s,
        slot_seconds=stored.slot_seconds,
        parallel_slots=stored.parallel_slots,
        worker_seconds=stored.slots * stored.slot_seconds,
    )


def _tuning_of(holder: HasSpec) -> StoredTuning:
    tuning = stored_spec(holder).tuning
    assert tuning is not None  # a tuning's job, or a tuning's plan
    return tuning


def tuning_out(tuning: TuningJob, job: Job, *, slots_done: int = 0) -> TuningOut:
    """The view; ``slots_done`` counts finished slots (public: every slot lasts the same)."""
    tuning_spec = _tuning_of(job)
    succeeded = job.status == JobStatus.SUCCEEDED
    links = {"self": f"/v1/tuning-jobs/{tuning.id}", "job": f"/v1/jobs/{job.id}"}
    if succeeded:
        links["model"] = f"/v1/jobs/{job.id}/model"
    if job.report_blob is not None:  # a succeeded tuning's, or one that ended committing its reservation
        links["report"] = f"/v1/jobs/{job.id}/report"
    return TuningOut(
        id=tuning.id,
        dataset_id=tuning.dataset_id,
        status=job.status,
        job_id=job.id,
        best_job_id=job.id if succeeded else None,
        selected=tuning_spec.selected if succeeded else None,
        selected_metric=(job.metrics or {}).get(tuning_spec.selection.metric) if succeeded else None,
        error_code=job.error_code,
        selection=tuning_spec.selection.to_json(),
        trials=_trials(tuning_spec),
        search_space=tuning_spec.search_space_json(),
        candidates=tuning_spec.public_candidates(),
        schedule=_schedule(tuning_spec, slots_done=slots_done),
        epsilon_reserved=job.epsilon_ledger,
        epsilon_committed=job.epsilon_committed,
        epsilon_one_trial=tuning_spec.epsilon_one_trial,
        epsilon_separate_jobs=tuning_spec.epsilon_separate_jobs,
        delta=job.delta,
        created_at=tuning.created_at,
        links=links,
    )


def _request_hash(request: TuningCreate) -> str:
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@router.post("/estimate", response_model=TuningEstimate)
def estimate(
    _planning: PlanningSlotDep, request: TuningCreate, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> TuningEstimate:
    """What the whole tuning would be charged (one ledger entry), against its trials as separate jobs."""
    plan, budget, _ = _plan(services, session, tenant, request)
    tuning = _tuning_of(plan.carrier)
    schedule = _schedule(tuning, slots_done=0)
    assert schedule is not None  # every tuning planned now has one
    return TuningEstimate(
        epsilon_reserved=plan.carrier.epsilon_ledger,
        epsilon_separate_jobs=plan.epsilon_separate_jobs,
        epsilon_one_trial=plan.epsilon_one_trial,
        delta=plan.carrier.delta,
        admissible=ledger.check_admissible(budget, plan.carrier.curve) is not None,
        budget_remaining_epsilon=ledger.remaining_epsilon(budget),
        candidates=tuning.public_candidates(),
        trials=_trials(tuning),
        schedule=schedule,
        init_chain=init_chain_estimate(plan.carrier),
    )


@router.post("", status_code=202, response_model=TuningOut)
def create(
    _planning: PlanningSlotDep,
    request: TuningCreate,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> TuningOut | JSONResponse:
    """Plan every configuration, reserve the whole tuning as one ledger entry, and queue its job."""
    idempotent = IdempotentRequest(
        tenant_id=tenant.id, key=idempotency_key, request_hash=_request_hash(request), what="request body"
    )
    existing = earlier(session, TuningJob, idempotent)
    if existing is not None:
        return _replayed(session, existing)
    plan, _, queue = _plan(services, session, tenant, request)
    session.close()
    holder: dict[str, TuningJob] = {}

    def add_tuning(tx: Session, job: Job) -> None:
        tuning = TuningJob(
            tenant_id=tenant.id,
            dataset_id=job.dataset_id,
            job_id=job.id,
            idempotency_key=idempotency_key,
            request_hash=idempotent.request_hash if idempotency_key else None,
        )
        tx.add(tuning)
        tx.flush()
        holder["tuning"] = tuning

    def admit() -> tuple[TuningJob, Job, bool]:
        job = lifecycle.admit(
            services.db,
            plan=plan.carrier,
            tenant_id=tenant.id,
            dataset_id=request.base.dataset_id,
            actor=f"tenant:{tenant.id}",
            max_active_jobs=services.settings.max_active_jobs_per_tenant,
            idempotency_key=None,
            request_hash=idempotent.request_hash,
            recheck_access=lambda tx: dataset_for(tx, tenant, request.base.dataset_id, need="submit"),
            queue=queue,
            with_job=add_tuning,
        )
        return holder["tuning"], job, False

    def replay(replay_session: Session, first: TuningJob) -> tuple[TuningJob, Job, bool]:
        job = replay_session.get(Job, first.job_id)
        assert job is not None
        return first, job, True

    tuning, job, replayed = create_once(services.db, TuningJob, idempotent, create=admit, replay=replay)
    out = tuning_out(tuning, job)
    if replayed:
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    try:
        dispatch_with_settings(services.db, services.dispatcher, services.settings)
    except Exception:
        log.exception("dispatch failed", extra={"job_id": job.id})
    log.info("tuning admitted", extra={"tuning_id": tuning.id, "job_id": job.id, "tenant_id": tenant.id})
    return out


def _replayed(session: Session, tuning: TuningJob) -> JSONResponse:
    job = session.get(Job, tuning.job_id)
    assert job is not None
    return JSONResponse(tuning_out(tuning, job).model_dump(mode="json"), status_code=200)


def _tuning_for(session: Session, tenant: Tenant, tuning_id: str) -> tuple[TuningJob, Job]:
    """The tuning and its job, with the job's access rules (404 if the caller may not know it)."""
    tuning = session.get(TuningJob, tuning_id)
    if tuning is None:
        raise not_found("tuning job")
    try:
        job = job_for(session, tenant, tuning.job_id, need="read")
    except NotFound:
        raise not_found("tuning job") from None
    return tuning, job


@router.get("/{tuning_id}", response_model=TuningOut)
def get_tuning(tuning_id: str, session: SessionDep, tenant: TenantDep) -> TuningOut:
    tuning, job = _tuning_for(session, tenant, tuning_id)
    return tuning_out(tuning, job, slots_done=tuning_slots.done_count(session, job))


@router.get("", response_model=TuningList)
def list_tunings(
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> TuningList:
    """Newest first: the tunings whose job the caller may read."""
    query = (
        select(TuningJob, Job)
        .join(Job, Job.id == TuningJob.job_id)
        .where(visible_jobs(tenant))
        .order_by(TuningJob.id.desc())
        .limit(limit + 1)
    )
    if cursor is not None:
        (after,) = decode_cursor(cursor, fields=[cursor_id])
        query = query.where(TuningJob.id < after)
    rows = list(session.execute(query).all())
    items = [tuning_out(tuning, job, slots_done=tuning_slots.done_count(session, job)) for tuning, job in rows[:limit]]
    next_cursor = encode_cursor([rows[limit - 1][0].id]) if len(rows) > limit else None
    return TuningList(items=items, next_cursor=next_cursor)


@router.post("/{tuning_id}/cancel", status_code=202, response_model=TuningOut)
def cancel(tuning_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep) -> TuningOut:
    """Queued: released at once. Running: ends at once and commits the whole tuning's charge (a
    partial tuning cannot be charged less without revealing how many trials ran); its slots stop."""
    tuning, job = _tuning_for(session, tenant, tuning_id)
    job_for(session, tenant, job.id, need="cancel")
    report = cancel_report_writer(job, session.get(Dataset, job.dataset_id))
    session.close()
    cancelled = lifecycle.cancel(
        services.db, job_id=job.id, dataset_id=job.dataset_id, actor=f"tenant:{tenant.id}", write_report=report
    )
    report_outbox.deliver(services.db, services.blobs, job_id=job.id)
    return tuning_out(tuning, cancelled)
