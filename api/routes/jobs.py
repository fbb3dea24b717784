"""Job estimate, submission (admission against the ledger), status, cancel, artifacts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.job_views import event_out, job_out
from api.problems import Problem
from api.report_responses import html_report_response
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.event_stream import (
    EVENT_STREAM_MEDIA_TYPE,
    EventStreamResponse,
    event_stream_response,
    reserve_stream_slot,
    resume_point,
    wants_event_stream,
)
from api.routes.hf_download import zip_response
from api.routes.planning_slots import PlanningSlotDep
from api.routes.routing import ReleasingRoute
from api.routes.stream_access import api_reader, bearer_key_digest
from api.routes.stream_slots import StreamSlot
from kernel import privacy
from kernel.access.roles import dataset_for, job_for, relation_to, visible_jobs
from kernel.base_models.init import resolve_init
from kernel.datasets.stored_facts import facts_of
from kernel.db.idempotency import IdempotentRequest, create_once, earlier
from kernel.db.orm import Dataset, Job, JobEvent, PrivacyBudget, Tenant
from kernel.db.pagination import cursor_id, decode_cursor, encode_cursor
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.dispatch import dispatch_with_settings
from kernel.jobs.evaluation import expected_interval
from kernel.jobs.planning import JobPlan, job_choices, plan_job, request_hash
from kernel.jobs.routing import route_job
from kernel.jobs.status import TERMINAL_STATUSES, JobStatus
from kernel.ledger import operations as ledger
from kernel.model_catalogue import ModelSizeLimits
from kernel.reporting.ended_report import cancel_report_writer
from kernel.reporting.init_report import chain_guarantees, estimate_notice
from kernel.reporting.init_visibility import LevelCache, chain_levels, spec_for_viewer
from kernel.reporting.redaction import report_for_viewer
from kernel.schemas.jobs import InitChainEstimate, JobCreate, JobEventOut, JobList, JobOut, PrivacyEstimate
from kernel.schemas.stored_spec import JobStart, stored_spec
from kernel.services import Services

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.jobs")


def job_planner(
    services: Services, session: Session, tenant: Tenant, spec: JobCreate
) -> tuple[Callable[[JobCreate], JobPlan], Dataset, PrivacyBudget]:
    """A planner for specs on ``spec``'s dataset (with its budget's δ, the service's limits and
    ``spec``'s resolved ``model.init``), the dataset and its budget."""
    dataset = dataset_for(session, tenant, spec.dataset_id, need="submit")
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    init = (
        resolve_init(session, tenant, spec.model.init, blobs=services.blobs, dataset=dataset)
        if spec.model.init is not None
        else None
    )
    settings = services.settings

    def plan(candidate: JobCreate) -> JobPlan:
        return plan_job(
            candidate,
            dataset,
            dataset_delta=budget.delta,
            max_steps=settings.max_steps,
            max_time_limit_s=settings.job_time_limit_s,
            model_limits=ModelSizeLimits.from_settings(settings),
            init=init,
        )

    return plan, dataset, budget


def _plan(
    services: Services, session: SessionDep, tenant: Tenant, spec: JobCreate
) -> tuple[JobPlan, PrivacyBudget, str]:
    """The job's plan, its dataset's budget and its queue (a queue the service lacks is a 422 here,
    at estimate as at submission)."""
    plan_for, dataset, budget = job_planner(services, session, tenant, spec)
    plan = plan_for(spec)
    return plan, budget, route_job(spec, plan, facts_of(dataset), services.settings)


def _public_estimate(plan: JobPlan) -> PrivacyEstimate:
    """A job on a public dataset: charged nothing, always admissible (there is no budget)."""
    return PrivacyEstimate(
        noise_multiplier=plan.noise_multiplier,
        sampling_probability=plan.plan.sampling_probability,
        steps=plan.plan.steps,
        delta=plan.delta,
        epsilon_reserved=0.0,
        epsilon_single_job=None,
        noise_std_on_sum=plan.noise_std_on_sum,
        sensitivity=plan.plan.sensitivity,
        admissible=True,
        witness_order=None,
        public_dataset=True,
        budget_remaining_epsilon=None,
        largest_admissible_epsilon=None,
        largest_admissible_steps_reason="the dataset is public: it has no budget, so any number of steps is admitted",
        smallest_admissible_noise_multiplier_reason="the dataset is public: it has no budget to fit",
        evaluation_interval=expected_interval(plan.evaluation) if plan.evaluation else None,
        init_chain=init_chain_estimate(plan),
    )


def _estimate(plan: JobPlan, budget: PrivacyBudget, *, max_steps: int) -> PrivacyEstimate:
    if plan.public_dataset:
        return _public_estimate(plan)
    witness = ledger.check_admissible(budget, plan.curve)
    choices = job_choices(plan, budget, max_steps=max_steps)
    return PrivacyEstimate(
        noise_multiplier=plan.noise_multiplier,
        sampling_probability=plan.plan.sampling_probability,
        steps=plan.plan.steps,
        delta=plan.delta,
        epsilon_reserved=plan.epsilon_ledger,
        epsilon_single_job=plan.epsilon_prv,
        epsilon_single_job_method=plan.epsilon_prv_method,
        noise_std_on_sum=plan.noise_std_on_sum,
        sensitivity=plan.plan.sensitivity,
        admissible=witness is not None,
        witness_order=privacy.ORDERS[witness] if witness is not None else None,
        budget_remaining_epsilon=ledger.remaining_epsilon(budget),
        budget_remaining_after_epsilon=choices.remaining_after_epsilon,
        largest_admissible_epsilon=choices.largest_admissible_epsilon,
        smallest_admissible_noise_multiplier=choices.smallest_admissible_noise_multiplier,
        smallest_admissible_noise_multiplier_reason=choices.smallest_admissible_noise_multiplier_reason,
        largest_admissible_steps=choices.largest_admissible_steps,
        largest_admissible_steps_reason=choices.largest_admissible_steps_reason,
        evaluation_epsilon=(
            privacy.ledger_epsilon(privacy.rdp_curve(plan.evaluation.event()), plan.delta) if plan.evaluation else None
        ),
        evaluation_interval=expected_interval(plan.evaluation) if plan.evaluation else None,
        init_chain=init_chain_estimate(plan),
    )


def init_chain_estimate(plan: JobPlan) -> InitChainEstimate | None:
    """The warning that the job would use the same rows again, with the composed ε
    (closed forms only: the request path never waits for the numeric accountants)."""
    init = stored_spec(plan).init
    guarantees = chain_guarantees(
        None if init is None else init.to_json(),
        actual_event=None if plan.public_dataset else plan.event_json,
        delta=plan.delta,
        algorithm=plan.algorithm.name,
        numeric=False,
    )
    chain = init.chain if isinstance(init, JobStart) else None
    block = estimate_notice(guarantees, [] if chain is None else [link.to_json() for link in chain.links])
    return None if block is None else InitChainEstimate(**block)


@router.post("/estimate", response_model=PrivacyEstimate)
def estimate(
    _planning: PlanningSlotDep,
    spec: JobCreate,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
) -> PrivacyEstimate:
    """Dry run: the noise, steps and ε the job would be charged, whether it fits now, what would
    remain, and the nearest choices that fit (most steps at this σ, least σ at these steps).
    Capped per key and per process (429 ``too-many-computations``): pricing is CPU-bound."""
    plan, budget, _ = _plan(services, session, tenant, spec)
    return _estimate(plan, budget, max_steps=services.settings.max_steps)


@router.post("", status_code=202, response_model=JobOut)
def submit(
    _planning: PlanningSlotDep,
    spec: JobCreate,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)] = None,
) -> JobOut | JSONResponse:
    """Admit the job against the dataset's ledger, then enqueue it."""
    request = IdempotentRequest(
        tenant_id=tenant.id, key=idempotency_key, request_hash=request_hash(spec), what="request body"
    )
    existing = earlier(session, Job, request)
    if existing is not None:
        return _replayed(session, tenant, existing)
    plan, _, queue = _plan(services, session, tenant, spec)
    session.close()  # give the read connection back before taking a write one

    def admit() -> tuple[Job, bool]:
        return lifecycle.admit(
            services.db,
            plan=plan,
            tenant_id=tenant.id,
            dataset_id=spec.dataset_id,
            actor=f"tenant:{tenant.id}",
            max_active_jobs=services.settings.max_active_jobs_per_tenant,
            idempotency_key=idempotency_key,
            request_hash=request.request_hash,
            recheck_access=lambda tx: dataset_for(tx, tenant, spec.dataset_id, need="submit"),
            queue=queue,
        ), False

    # A concurrent retry with the same key that committed first is answered as a replay.
    try:
        job, replayed = create_once(
            services.db, Job, request, create=admit, replay=lambda _session, first: (first, True)
        )
    except lifecycle.BudgetExhausted as refused:  # say what would fit now, as the estimate does
        with services.db.read_session() as fresh:
            budget = fresh.get(PrivacyBudget, refused.dataset_id)
            largest = (
                job_choices(plan, budget, max_steps=services.settings.max_steps).largest_admissible_epsilon
                if budget is not None
                else None
            )
        raise refused.with_largest_admissible(largest) from None
    if replayed:
        return _replayed(session, tenant, job)
    out = _job_view(session, tenant, job)
    try:  # sent now if the tenant has a free slot in the broker (kernel/jobs/dispatch.py)
        dispatch_with_settings(services.db, services.dispatcher, services.settings)
    except Exception:  # the reconciler sends queued jobs in its next round
        log.exception("dispatch failed", extra={"job_id": out.id})
    log.info("job admitted", extra={"job_id": out.id, "tenant_id": tenant.id})
    return out


def _job_view(session: Session, tenant: Tenant, job: Job, *, cache: LevelCache | None = None) -> JobOut:
    """The job as this tenant may see it: its spec's init chain redacted (kernel/reporting/init_visibility.py)."""
    out = job_out(job)
    stored = stored_spec(job)
    if stored.init is None and not stored.is_tuning:
        return out
    return out.model_copy(update={"spec": spec_for_viewer(session, tenant, stored, cache=cache)})


def _replayed(session: Session, tenant: Tenant, job: Job) -> JSONResponse:
    """A retried submission: the job its first attempt created, 200 instead of 202."""
    return JSONResponse(_job_view(session, tenant, job).model_dump(mode="json"), status_code=200)


@router.get("", response_model=JobList)
def list_jobs(
    session: SessionDep,
    tenant: TenantDep,
    dataset_id: str | None = None,
    status: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> JobList:
    """The caller's own jobs and, on datasets it owns, every analyst's jobs too."""
    query = select(Job).where(visible_jobs(tenant))
    if dataset_id:
        query = query.where(Job.dataset_id == dataset_id)
    if status:
        query = query.where(Job.status == status)
    if cursor:
        (last_id,) = decode_cursor(cursor, fields=(cursor_id,))
        last = session.scalar(select(Job).where(Job.id == last_id, visible_jobs(tenant)))
        if last is None:
            raise Problem(status=422, slug="invalid-cursor", detail="malformed cursor")
        query = query.where(
            (Job.created_at < last.created_at) | ((Job.created_at == last.created_at) & (Job.id < last.id))
        )
    jobs = list(session.scalars(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)))
    next_cursor = encode_cursor([jobs[limit - 1].id]) if len(jobs) > limit else None
    cache: LevelCache = {}  # the listing's jobs often share a start
    return JobList(items=[_job_view(session, tenant, j, cache=cache) for j in jobs[:limit]], next_cursor=next_cursor)


@router.get("/{job_id}", response_model=JobOut)
def get_job(job_id: str, session: SessionDep, tenant: TenantDep) -> JobOut:
    return _job_view(session, tenant, job_for(session, tenant, job_id, need="read"))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobOut)
def cancel(job_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep) -> JobOut:
    """Cancel: a queued job is released at once; a running one stops at its next check."""

    job = job_for(session, tenant, job_id, need="cancel")
    report = cancel_report_writer(job, session.get(Dataset, job.dataset_id))
    session.close()  # give the read connection back before taking a write one
    cancelled = lifecycle.cancel(
        services.db, job_id=job.id, dataset_id=job.dataset_id, actor=f"tenant:{tenant.id}", write_report=report
    )
    report_outbox.deliver(services.db, services.blobs, job_id=job.id)
    return _job_view(session, tenant, cancelled)


@router.get(
    "/{job_id}/events",
    response_model=list[JobEventOut],
    responses={
        200: {
            "content": {
                EVENT_STREAM_MEDIA_TYPE: {
                    "schema": {
                        "type": "string",
                        "description": "Server-Sent Events: id = seq, event = kind, "
                        "data = one JobEventOut as JSON; resumable with Last-Event-ID",
                    }
                }
            }
        }
    },
)
def events(
    job_id: str,
    request: Request,
    reserved: Annotated[StreamSlot | None, Depends(reserve_stream_slot, scope="function")],
    session: SessionDep,
    tenant: TenantDep,
    services: ServicesDep,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    accept: Annotated[str | None, Header()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> list[JobEventOut] | EventStreamResponse:
    """The job's events in order (``seq`` = 1, 2, 3 … within the job): a JSON page, or (Accept:
    text/event-stream) a live SSE stream, capped per API key (429 ``too-many-streams``) and ended
    at the first poll after the key or its tenant loses access to the job."""
    job = job_for(session, tenant, job_id, need="read")
    if wants_event_stream(accept):
        session.close()  # the stream polls with its own short sessions
        principal = bearer_key_digest(request)
        assert principal is not None  # TenantDep authenticated a Bearer key
        return event_stream_response(
            app=request.app,
            services=services,
            principal=principal,
            job_id=job.id,
            after=resume_point(after, last_event_id),
            still_allowed=api_reader(key_digest=principal, job_id=job.id),
            reserved=reserved,
        )
    rows = session.scalars(
        select(JobEvent)
        .where(JobEvent.job_id == job.id, JobEvent.seq > resume_point(after, None))  # clamped: 2**70 overflowed
        .order_by(JobEvent.seq)
        .limit(limit)
    )
    return [event_out(e) for e in rows]


def _artifact_ready(job: Job, blob: str | None) -> str:
    if job.status != JobStatus.SUCCEEDED or blob is None:
        raise Problem(
            status=409,
            slug="job-not-succeeded",
            detail=f"artifacts exist only for succeeded jobs; this job is {job.status}",
        )
    return blob


def report_key(job: Job) -> str:
    """The blob of the job's privacy report: every job that committed ε has one once it has ended
    (succeeded, or cancelled or failed after a worker opened the data); else 409 saying why not."""
    if job.report_blob is not None:
        return job.report_blob
    if job.status not in TERMINAL_STATUSES:
        detail = f"a job's privacy report exists once it has ended; this job is {job.status}"
    elif not job.epsilon_committed:
        detail = (
            f"this job is {job.status} and spent nothing (ε 0: it ended before any worker opened the data, or "
            "its dataset is public): it has no privacy report"
        )
    else:
        detail = (
            f"this job is {job.status} and has no stored privacy report (it ended before such jobs got one, or "
            "the report could not be stored); its ledger entries state what it committed"
        )
    raise Problem(status=409, slug="job-not-succeeded", detail=detail)


@router.get(
    "/{job_id}/model",
    response_class=FileResponse,
    responses={
        200: {
            "description": "the model file (safetensors), or with format=hf or format=peft a ZIP",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "application/zip": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        307: {"description": "with PRIVTRAIN_DOWNLOAD_MODE=presigned: a short-lived URL of the object store"},
    },
)
def download_model(
    job_id: str,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
    format: Annotated[
        Literal["safetensors", "hf", "peft"],
        Query(
            description="safetensors (default: the file privtrain.load_model reads); hf: a ZIP of a Transformers "
            "save_pretrained folder (config.json, model.safetensors, privacy_report.json, README.md), "
            "for models named 'hf' only; peft: a ZIP of the PEFT adapter folder (adapter_config.json, "
            "adapter_model.safetensors, privacy_report.json, README.md) of an 'hf' model fine-tuned with LoRA"
        ),
    ] = "safetensors",
) -> Response:
    """The model file, streamed; or, with pre-signed downloads, a 307 to the object store. Either
    way only after the tenant checks (another tenant gets 404), with the file's SHA-256.
    ``format=hf``: an `hf` model as a Transformers folder, zipped; ``format=peft``: a LoRA job's PEFT
    adapter folder, zipped (docs/hugging-face.md)."""
    job = job_for(session, tenant, job_id, need="read")
    if job.status == JobStatus.SUCCEEDED and job.model_blob is None:
        raise Problem(
            status=410,
            slug="model-deleted",
            detail="this job's model was erased when the owner of its dataset deleted the dataset and its models; "
            "its report is kept",
        )
    key = _artifact_ready(job, job.model_blob)
    if format != "safetensors":
        report = report_outbox.read_report(session, services.blobs, job_id=job.id, key=report_key(job))
        owner = relation_to(session, tenant, job) == "dataset-owner"
        levels = chain_levels(session, tenant, report.get("init"))
        viewed = report_for_viewer(report, viewer_owns_dataset=owner, init_levels=levels)
        return zip_response(
            services.blobs.local_path(key), format=format, report=viewed, filename=f"{job.id}-{format}.zip"
        )
    filename = f"{job.id}.safetensors"
    headers = {"X-Content-SHA256": job.model_sha256 or ""}
    if services.settings.download_mode == "presigned":
        url = services.blobs.presigned_url(key, filename=filename, ttl_s=services.settings.presigned_url_ttl_s)
        if url is not None:
            return RedirectResponse(url, status_code=307, headers={**headers, "Cache-Control": "no-store"})
    return FileResponse(
        services.blobs.local_path(key), media_type="application/octet-stream", filename=filename, headers=headers
    )


@router.get(
    "/{job_id}/report",
    responses={
        200: {
            "content": {
                "application/json": {},
                "text/html": {
                    "schema": {
                        "type": "string",
                        "description": "format=html: the same report as one "
                        "self-contained HTML page (inline CSS and SVG plots, no external assets)",
                    }
                },
            }
        }
    },
)
def download_report(
    job_id: str,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
    format: Annotated[Literal["json", "html"], Query(description="json (default) or html")] = "json",
) -> Response:
    """The job's privacy report, redacted for the viewer: of a succeeded job, or of one cancelled or
    failed after it committed ε (no model; its ``outcome`` says how it ended)."""
    job = job_for(session, tenant, job_id, need="read")
    report = report_outbox.read_report(session, services.blobs, job_id=job.id, key=report_key(job))
    if format == "html":
        return html_report_response(session, job, report, viewer_tenant_id=tenant.id)
    owner = relation_to(session, tenant, job) == "dataset-owner"
    levels = chain_levels(session, tenant, report.get("init"))
    return JSONResponse(report_for_viewer(report, viewer_owns_dataset=owner, init_levels=levels))
