"""The dashboard: server-rendered pages under ``/ui`` (datasets and budget gauges, invitations,
a dataset's ledger, jobs with live status and a cancel button, a job's HTML report), plus the job
event stream for EventSource.

Authentication: the same API keys. A browser logs in once (``/ui/login``), which starts a
server-side session (:mod:`kernel.access.dashboard_sessions`) named by the cookie of
:mod:`api.routes.ui_session`; scripts may still send ``Authorization: Bearer``. Datasets follow the
API's roles (:mod:`kernel.access.roles`: owned ones, and shared ones whose invitation the tenant accepted;
only the owner sees the ledger); jobs are the tenant's own. Anything else answers 404, as in the
API. Forms (login, logout, cancel, invitation answers) are CSRF-protected posts that redirect
back (post/redirect/get). Pages are excluded from the OpenAPI schema (not part of the v1 API).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any
from urllib.parse import parse_qs

import anyio
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup
from sqlalchemy import select

from api.job_views import job_epsilon, single_job_epsilon
from api.problems import Problem
from api.report_responses import html_report_response
from api.routes.deps import ServicesDep, SessionDep, job_of_tenant
from api.routes.event_stream import EventStreamResponse, event_stream_response, resume_point
from api.routes.jobs import report_key
from api.routes.stream_access import bearer_key_digest, dashboard_reader
from api.routes.ui_session import (
    LoginFormCookie,
    SessionCookie,
    clear_session_cookie,
    csrf_ok,
    new_login_form,
    read_cookie,
    set_session_cookie,
)
from kernel.access.dashboard_sessions import DashboardSession, StartedSession, end_session, live_session, start_session
from kernel.access.invitations import Answer, InvitationNotFound, answer_invitation, pending_invitations
from kernel.access.keys import key_digest, tenant_for_key
from kernel.access.roles import JOB_PERMISSIONS, dataset_access, job_for, relation_to, visible_datasets
from kernel.datasets.deletion import deletion_progress
from kernel.datasets.status import DatasetStatus
from kernel.db.engine import Database
from kernel.db.orm import ApiKey, Dataset, Job, JobEvent, LedgerEntry, PrivacyBudget, Tenant
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.event_text import EPSILON_DIGITS, EVENT_SENTENCES, GUARANTEE_FIELDS, event_sentence
from kernel.jobs.status import TERMINAL_STATUSES
from kernel.ledger import operations as ledger
from kernel.ledger.budget_gauge import budget_gauge
from kernel.ledger.explanations import jobs_of
from kernel.reporting import ledger_history, opening_budget, plots
from kernel.reporting.ended_report import cancel_report_writer
from kernel.reporting.init_visibility import spec_for_viewer
from kernel.reporting.templating import render
from kernel.schemas.stored_spec import stored_spec
from kernel.storage.blobs import BlobStore

router = APIRouter(prefix="/ui", include_in_schema=False)
log = logging.getLogger("privtrain.ui")

MAX_FORM_BYTES = 4096
PAGE_LIMIT = 100
INVITATION_LIMIT = 50
EVENT_LIMIT = 200
LIVE_STREAMS = 5
"""Browsers allow about 6 connections per host over HTTP/1.1: at most this many live streams."""


@dataclass(frozen=True)
class Viewer:
    """The caller; ``session`` is its live dashboard session (None for a script's Bearer key)."""

    tenant: Tenant
    session: DashboardSession | None


def _session_of_cookie(db_session: SessionDep, cookie: SessionCookie) -> DashboardSession | None:
    """The live server-side session the cookie names: logged out, expired, revoked-key and
    forged-digest cookies name none."""
    live = live_session(db_session, cookie.token)
    if live is None or not hmac.compare_digest(live.key_digest, cookie.key_digest):
        return None
    return live


def get_viewer(request: Request, services: ServicesDep, db_session: SessionDep) -> Viewer | None:
    """The caller by Bearer header (scripts) or by session cookie (browsers); None if neither."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if header:
        tenant = tenant_for_key(db_session, token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        return Viewer(tenant=tenant, session=None) if tenant is not None else None
    cookie = read_cookie(request, services.settings)
    live = _session_of_cookie(db_session, cookie) if isinstance(cookie, SessionCookie) else None
    tenant = db_session.get(Tenant, live.tenant_id) if live is not None else None
    return Viewer(tenant=tenant, session=live) if tenant is not None and live is not None else None


ViewerDep = Annotated[Viewer | None, Depends(get_viewer)]


def _security_headers(nonce: str | None) -> dict[str, str]:
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    return {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src {script}; connect-src 'self'; style-src 'unsafe-inline'; "
            "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
        ),
        "Cache-Control": "private, no-store",
        "X-Content-Type-Options": "nosniff",
        # not no-referrer: under it Chromium posts this site's own forms with "Origin: null"
        "Referrer-Policy": "same-origin",
        "X-Frame-Options": "DENY",
    }


def _page(template: str, *, viewer: Viewer | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    html = render(
        template,
        nonce=nonce,
        csrf_token=viewer.session.csrf_token if viewer and viewer.session else "",
        tenant_name=viewer.tenant.name if viewer else None,
        epsilon_of=job_epsilon,
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers=_security_headers(nonce))


def _login_redirect() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303, headers={"Cache-Control": "no-store"})


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (small; first value per field); anything else is empty."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:  # stop reading: a login form is tiny
            return {}
    try:
        fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True, max_num_fields=10)
    except ValueError:  # too many fields
        return {}
    return {name: values[0] for name, values in fields.items()}


def _message_page(
    *,
    status_code: int,
    title: str,
    message: str,
    back_href: str = "/ui/login",
    back_label: str = "Back to the dashboard",
) -> HTMLResponse:
    """A page that only explains (no script, no form, no session data)."""
    html = render(
        "error.html",
        title=title,
        message=message,
        back_href=back_href,
        back_label=back_label,
        nonce="",
        csrf_token="",
        tenant_name=None,
        epsilon_of=job_epsilon,
    )
    return HTMLResponse(html, status_code=status_code, headers=_security_headers(None))


def _csrf_rejected() -> HTMLResponse:
    return _message_page(
        status_code=403,
        title="Request refused",
        message="The form was not sent from this dashboard session (missing or wrong CSRF "
        "token, or a cross-site origin). Reload the page and try again.",
    )


async def _session_form(request: Request, viewer: Viewer | None) -> dict[str, str] | None:
    """The posted form of a logged-in browser session whose CSRF token matches; None otherwise
    (no session, a script's Bearer key, a wrong token or a cross-site request)."""
    form = await _form(request)
    if viewer is None or viewer.session is None:
        return None
    return form if csrf_ok(request, viewer.session.csrf_token, form.get("csrf_token")) else None


# ---------------------------------------------------------------------------------- session


@router.get("", response_class=HTMLResponse)
def home(viewer: ViewerDep) -> Response:
    return RedirectResponse("/ui/datasets" if viewer else "/ui/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, services: ServicesDep, viewer: ViewerDep) -> Response:
    """The login form; a stateless signed cookie carries its CSRF token. A browser with a live
    session goes to its datasets (replacing its cookie would orphan the session, not end it)."""
    if viewer is not None and viewer.session is not None:
        return RedirectResponse("/ui/datasets", status_code=303)
    anonymous = read_cookie(request, services.settings)
    if not isinstance(anonymous, LoginFormCookie):
        anonymous = new_login_form()
    response = _page("login.html", viewer=None, login_csrf=anonymous.csrf_token, error=None)
    set_session_cookie(response, anonymous, services.settings)
    return response


def _login(db: Database, key: str, max_age_s: float) -> StartedSession | None:
    """A new session for an active key (None for an unknown or revoked one); purges old rows."""
    digest = key_digest(key)
    with db.write_transaction() as tx:
        api_key = tx.scalar(select(ApiKey).where(ApiKey.digest == digest))
        if api_key is None or api_key.revoked_at is not None or not hmac.compare_digest(api_key.digest, digest):
            return None
        return start_session(tx, api_key=api_key, max_age_s=max_age_s)


def _logout(db: Database, cookie: SessionCookie) -> None:
    with db.write_transaction() as tx:
        live = live_session(tx, cookie.token)
        if live is not None:
            end_session(tx, live.id)


def _live_session(db: Database, cookie: SessionCookie) -> DashboardSession | None:
    with db.read_session() as db_session:
        return _session_of_cookie(db_session, cookie)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, services: ServicesDep) -> Response:
    """Start a server-side session: the cookie gets its fresh random token (no fixation)."""
    settings = services.settings
    current = read_cookie(request, settings)
    form = await _form(request)
    expected = current.csrf_token if isinstance(current, LoginFormCookie) else None
    if not csrf_ok(request, expected, form.get("csrf_token")):
        return _csrf_rejected()
    key = form.get("api_key", "").strip()
    started = await anyio.to_thread.run_sync(_login, services.db, key, settings.ui_session_max_age_s) if key else None
    if started is None:
        return _page(
            "login.html", viewer=None, status_code=401, login_csrf=expected, error="This API key is unknown or revoked."
        )
    response = RedirectResponse("/ui/datasets", status_code=303)
    cookie = SessionCookie(token=started.token, key_digest=started.session.key_digest, issued_at=time.time())
    set_session_cookie(response, cookie, settings)
    log.info("dashboard login", extra={"tenant_id": started.session.tenant_id, "ui_session_id": started.session.id})
    return response


@router.post("/logout", response_class=HTMLResponse)
async def logout(request: Request, services: ServicesDep) -> Response:
    """End the session server-side, so every copy of its cookie stops working, then drop the
    cookie. Without a live session there is no CSRF token to match: refused, as before."""
    cookie = read_cookie(request, services.settings)
    form = await _form(request)
    session_cookie = cookie if isinstance(cookie, SessionCookie) else None
    live = None
    if session_cookie is not None:
        live = await anyio.to_thread.run_sync(_live_session, services.db, session_cookie)
    if session_cookie is None or live is None or not csrf_ok(request, live.csrf_token, form.get("csrf_token")):
        return _csrf_rejected()
    await anyio.to_thread.run_sync(_logout, services.db, session_cookie)
    log.info("dashboard logout", extra={"tenant_id": live.tenant_id, "ui_session_id": live.id})
    response = _login_redirect()
    clear_session_cookie(response, services.settings)
    return response


# ---------------------------------------------------------------------------------- datasets


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(viewer: ViewerDep, db_session: SessionDep) -> Response:
    """The tenant's datasets and those shared with it (accepted invitations), each with its
    budget gauge, and the invitations waiting for an answer."""
    if viewer is None:
        return _login_redirect()
    rows = db_session.execute(
        select(Dataset, PrivacyBudget, Tenant.name)
        .join(PrivacyBudget)
        .join(Tenant, Tenant.id == Dataset.tenant_id)
        .where(visible_datasets(viewer.tenant), Dataset.status != DatasetStatus.DELETED)
        .order_by(Dataset.created_at.desc(), Dataset.id.desc())
        .limit(PAGE_LIMIT)
    ).all()
    items = [
        {
            "dataset": d,
            "budget": None if d.public else ledger.budget_summary(b),  # public: no budget
            "gauge": None if d.public else budget_gauge(b),
            "shared_by": None if d.tenant_id == viewer.tenant.id else owner,
        }
        for d, b, owner in rows
    ]
    invitations = pending_invitations(db_session, tenant=viewer.tenant, limit=INVITATION_LIMIT)
    return _page(
        "datasets.html",
        viewer=viewer,
        items=items,
        limit=PAGE_LIMIT,
        invitations=invitations[:INVITATION_LIMIT],
        more_invitations=len(invitations) > INVITATION_LIMIT,
    )


def _ledger_plot(history: list[Any]) -> Markup | None:
    if not history:
        return None
    return Markup(
        plots.ledger_timeline_svg(
            times=[p.created_at for p in history],
            committed=[p.committed_epsilon for p in history],
            total=[p.total_epsilon for p in history],
            budget=[p.budget_epsilon for p in history],
        )
    )


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(dataset_id: str, viewer: ViewerDep, db_session: SessionDep) -> Response:
    """A dataset's budget and the viewer's jobs on it; its owner also sees the whole ledger (an
    analyst may read the budget, not the ledger: kernel.access.roles)."""
    if viewer is None:
        return _login_redirect()
    access = dataset_access(db_session, viewer.tenant, dataset_id, need="read")
    dataset = access.dataset
    budget = db_session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    history: list[Any] = []
    if access.role == "owner" and not dataset.public:
        entries = list(
            db_session.scalars(
                select(LedgerEntry).where(LedgerEntry.dataset_id == dataset.id).order_by(LedgerEntry.seq)
            )
        )
        opening_epsilon, opening_delta = opening_budget(db_session, budget)
        history = ledger_history(
            entries, opening_epsilon=opening_epsilon, opening_delta=opening_delta, jobs=jobs_of(db_session, entries)
        )
    jobs = list(
        db_session.scalars(
            select(Job)
            .where(Job.dataset_id == dataset.id, Job.tenant_id == viewer.tenant.id)
            .order_by(Job.created_at.desc())
            .limit(PAGE_LIMIT)
        )
    )
    owner = db_session.get(Tenant, dataset.tenant_id) if access.role != "owner" else None
    return _page(
        "dataset.html",
        viewer=viewer,
        dataset=dataset,
        role=access.role,
        shared_by=owner.name if owner is not None else None,
        budget=None if dataset.public else ledger.budget_summary(budget),  # public: no budget, no ledger
        budget_bar=None if dataset.public else budget_gauge(budget),
        history=list(reversed(history)),
        ledger_svg=_ledger_plot(history),
        jobs=jobs,
        deletion=deletion_progress(db_session, dataset),
    )


def _answer_invitation(db: Database, *, tenant: Tenant, dataset_id: str, answer: Answer) -> str:
    """The answer, in the dataset's budget lock (kernel.access.invitations); returns the dataset's name."""
    with db.write_transaction() as tx:
        return answer_invitation(tx, tenant=tenant, dataset_id=dataset_id, answer=answer).dataset_name


async def _answer_form(
    *,
    request: Request,
    viewer: Viewer | None,
    services: ServicesDep,
    db_session: SessionDep,
    dataset_id: str,
    answer: Answer,
) -> Response:
    if await _session_form(request, viewer) is None:
        return _csrf_rejected()
    assert viewer is not None
    db_session.close()  # the write transaction reads again under the lock
    try:
        await anyio.to_thread.run_sync(
            partial(_answer_invitation, services.db, tenant=viewer.tenant, dataset_id=dataset_id, answer=answer)
        )
    except InvitationNotFound:
        return _message_page(
            status_code=404,
            title="No such invitation",
            message="There is no pending invitation to you for this dataset: it was answered "
            "already, withdrawn by its owner, or never existed.",
            back_href="/ui/datasets",
            back_label="Back to your datasets",
        )
    log.info("invitation answered", extra={"dataset_id": dataset_id, "tenant_id": viewer.tenant.id, "answer": answer})
    return RedirectResponse("/ui/datasets", status_code=303)


@router.post("/invitations/{dataset_id}/accept", response_class=HTMLResponse)
async def accept_invitation(
    dataset_id: str,
    request: Request,
    viewer: ViewerDep,
    services: ServicesDep,
    db_session: SessionDep,
) -> Response:
    """What ``POST /v1/invitations/{id}/accept`` does, from the datasets page's form: the tenant
    becomes an analyst of the dataset, which then appears in its list."""
    return await _answer_form(
        request=request, viewer=viewer, services=services, db_session=db_session, dataset_id=dataset_id, answer="accept"
    )


@router.post("/invitations/{dataset_id}/decline", response_class=HTMLResponse)
async def decline_invitation(
    dataset_id: str,
    request: Request,
    viewer: ViewerDep,
    services: ServicesDep,
    db_session: SessionDep,
) -> Response:
    """What ``POST /v1/invitations/{id}/decline`` does, from the datasets page's form."""
    return await _answer_form(
        request=request,
        viewer=viewer,
        services=services,
        db_session=db_session,
        dataset_id=dataset_id,
        answer="decline",
    )


# ---------------------------------------------------------------------------------- jobs


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(viewer: ViewerDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    jobs = list(
        db_session.scalars(
            select(Job)
            .where(Job.tenant_id == viewer.tenant.id)
            .order_by(Job.created_at.desc(), Job.id.desc())
            .limit(PAGE_LIMIT)
        )
    )
    names = dict(
        db_session.execute(  # the tenant's jobs: it knows their datasets' names, shared ones too
            select(Dataset.id, Dataset.name).where(Dataset.id.in_({j.dataset_id for j in jobs}))
        ).all()
    )
    live = [j.id for j in jobs if j.status not in TERMINAL_STATUSES][:LIVE_STREAMS]
    return _page(
        "jobs.html",
        viewer=viewer,
        jobs=jobs,
        dataset_names=names,
        live=live,
        live_config=_live_config(job_ids=live, after=0),
    )


def _epsilon_spent_so_far(events: list[JobEvent]) -> float:
    """ε of the steps run, as the worker last reported it (events newest first); 0 before any."""
    for event in events:
        spent = event.payload.get("epsilon_spent") if event.kind == "progress" else None
        if isinstance(spent, (int, float)) and not isinstance(spent, bool):
            return float(spent)
    return 0.0


def _live_config(*, job_ids: list[str], after: int) -> dict[str, Any]:
    """What the live script needs: the jobs to follow and the sentences of kernel.jobs.event_text."""
    return {
        "ids": job_ids,
        "after": after,
        "sentences": dict(EVENT_SENTENCES),
        "guaranteeFields": sorted(GUARANTEE_FIELDS),
        "digits": EPSILON_DIGITS,
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, viewer: ViewerDep, db_session: SessionDep) -> Response:
    """One job: progress, ε, a cancel button while it can be cancelled, its events in words."""
    if viewer is None:
        return _login_redirect()
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    dataset = db_session.get(Dataset, job.dataset_id)
    events = list(
        db_session.scalars(
            select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.seq.desc()).limit(EVENT_LIMIT)
        )
    )
    live = job.status not in TERMINAL_STATUSES
    may_cancel = (
        live and viewer.session is not None and relation_to(db_session, viewer.tenant, job) in JOB_PERMISSIONS["cancel"]
    )
    rows = [
        {"seq": e.seq, "created_at": e.created_at, "kind": e.kind, "sentence": event_sentence(e.kind, e.payload)}
        for e in events
    ]
    return _page(
        "job.html",
        viewer=viewer,
        job=job,
        spec=spec_for_viewer(db_session, viewer.tenant, stored_spec(job)),
        dataset=dataset,
        events=rows,
        live=live,
        may_cancel=may_cancel,
        epsilon_spent=_epsilon_spent_so_far(events),
        single_job=single_job_epsilon(job),
        live_config=_live_config(job_ids=[job.id], after=events[0].seq if events else 0),
    )


def _cancel_as(db: Database, blobs: BlobStore, *, tenant: Tenant, job_id: str) -> str | None:
    """Cancel as ``POST /v1/jobs/{id}/cancel`` does (kernel.jobs.lifecycle.cancel); the status of a
    job that had already ended, None once cancelled or asked to stop. 404/403 as the API answers."""
    with db.read_session() as session:
        job = job_for(session, tenant, job_id, need="cancel")
        dataset_id = job.dataset_id
        report = cancel_report_writer(job, session.get(Dataset, dataset_id))
    try:
        lifecycle.cancel(db, job_id=job_id, dataset_id=dataset_id, actor=f"tenant:{tenant.id}", write_report=report)
    except lifecycle.JobNotCancellable as ended:
        return ended.job_status
    report_outbox.deliver(db, blobs, job_id=job_id)
    return None


@router.post("/jobs/{job_id}/cancel", response_class=HTMLResponse)
async def cancel_job_form(
    job_id: str,
    request: Request,
    viewer: ViewerDep,
    services: ServicesDep,
    db_session: SessionDep,
) -> Response:
    """The job page's cancel button: a queued job ends at once and its reservation goes back to
    the budget; a running one stops after its current step. Back to the job page (post/redirect/get)."""
    if await _session_form(request, viewer) is None:
        return _csrf_rejected()
    assert viewer is not None
    db_session.close()
    ended = await anyio.to_thread.run_sync(
        partial(_cancel_as, services.db, services.blobs, tenant=viewer.tenant, job_id=job_id)
    )
    if ended is not None:
        return _message_page(
            status_code=409,
            title="Nothing to cancel",
            message=f"This job has already ended (status: {ended}).",
            back_href=f"/ui/jobs/{job_id}",
            back_label="Back to the job",
        )
    log.info("dashboard cancel", extra={"job_id": job_id, "tenant_id": viewer.tenant.id})
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.get("/jobs/{job_id}/report", response_class=HTMLResponse)
def job_report_page(job_id: str, viewer: ViewerDep, services: ServicesDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    try:
        key = report_key(job)
    except Problem as missing:  # a page that says why, not a problem document
        return _message_page(
            status_code=missing.status,
            title="No privacy report",
            message=missing.detail,
            back_href=f"/ui/jobs/{job.id}",
            back_label="Back to the job",
        )
    report = report_outbox.read_report(db_session, services.blobs, job_id=job.id, key=key)
    return html_report_response(db_session, job, report, viewer_tenant_id=viewer.tenant.id, dashboard_links=True)


@router.get("/jobs/{job_id}/events")
def job_event_source(
    job_id: str,
    request: Request,
    viewer: ViewerDep,
    services: ServicesDep,
    db_session: SessionDep,
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> EventStreamResponse:
    """The job's events as Server-Sent Events for the dashboard's EventSource (cookie auth);
    the same stream as ``GET /v1/jobs/{id}/events`` with ``Accept: text/event-stream``, under the
    same per-key stream cap. It ends at the first poll after logout or key revocation."""
    if viewer is None:
        raise Problem(status=401, slug="unauthorized", detail="log in at /ui/login")
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    db_session.close()  # the stream polls with its own short sessions
    ui_session_id = viewer.session.id if viewer.session is not None else None
    principal = viewer.session.key_digest if viewer.session is not None else bearer_key_digest(request)
    assert principal is not None  # a viewer is either a live session or a valid Bearer key
    return event_stream_response(
        app=request.app,
        services=services,
        principal=principal,
        job_id=job.id,
        after=resume_point(after, last_event_id),
        still_allowed=dashboard_reader(ui_session_id=ui_session_id, key_digest=principal, job_id=job.id),
    )
