"""The dashboard: server-rendered pages under ``/ui`` (datasets and budget gauges, a dataset's
ledger, jobs with live status, a job's HTML report), plus the job event stream for EventSource.

Authentication: the same API keys. A browser logs in once (``/ui/login``) and then carries the
signed session cookie of :mod:`app.api.ui_session`; scripts may still send ``Authorization:
Bearer``. Tenant scoping is the API's: another tenant's dataset or job answers 404. Pages are
excluded from the OpenAPI schema (they are not part of the v1 API).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from markupsafe import Markup
from sqlalchemy import select

from app import ledger
from app.api.deps import ServicesDep, SessionDep, dataset_of_tenant, job_of_tenant
from app.api.event_stream import EVENT_STREAM_MEDIA_TYPE, StreamTiming, job_event_stream
from app.api.ui_session import (
    UiSession,
    clear_session_cookie,
    csrf_ok,
    new_session,
    read_session,
    set_session_cookie,
)
from app.auth import key_digest, tenant_for_key
from app.models import TERMINAL_STATUSES, ApiKey, Dataset, Job, JobEvent, LedgerEntry, PrivacyBudget, Tenant
from app.problems import Problem
from app.reporting import ledger_history, opening_budget, plots
from app.reporting.responses import html_report_response
from app.reporting.templating import render

router = APIRouter(prefix="/ui", include_in_schema=False)
log = logging.getLogger("privtrain.ui")

MAX_FORM_BYTES = 4096
PAGE_LIMIT = 100
LIVE_STREAMS = 5
"""Browsers allow about 6 connections per host over HTTP/1.1: at most this many live streams."""


@dataclass(frozen=True)
class Viewer:
    tenant: Tenant
    session: UiSession | None


def _tenant_for_digest(db_session: SessionDep, digest: str) -> Tenant | None:
    api_key = db_session.scalar(select(ApiKey).where(ApiKey.digest == digest))
    if api_key is None or api_key.revoked_at is not None:
        return None
    return db_session.get(Tenant, api_key.tenant_id)


def get_viewer(request: Request, services: ServicesDep, db_session: SessionDep) -> Viewer | None:
    """The caller by Bearer header (scripts) or by session cookie (browsers); None if neither."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    ui_session = read_session(request, services.settings)
    tenant: Tenant | None = None
    if header:
        if scheme.lower() == "bearer" and token.strip():
            tenant = tenant_for_key(db_session, token.strip())
    elif ui_session is not None and ui_session.key_digest:
        tenant = _tenant_for_digest(db_session, ui_session.key_digest)
    return Viewer(tenant=tenant, session=ui_session) if tenant is not None else None


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
        "Referrer-Policy": "no-referrer",
        "X-Frame-Options": "DENY",
    }


def _page(template: str, *, viewer: Viewer | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    html = render(
        template,
        nonce=nonce,
        csrf_token=viewer.session.csrf_token if viewer and viewer.session else "",
        tenant_name=viewer.tenant.name if viewer else None,
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


def _csrf_rejected() -> HTMLResponse:
    html = render("error.html", title="Request refused",
                  message="The form was not sent from this dashboard session (missing or wrong CSRF "
                  "token, or a cross-site origin). Reload the page and try again.",
                  nonce="", csrf_token="", tenant_name=None)
    return HTMLResponse(html, status_code=403, headers=_security_headers(None))


# ---------------------------------------------------------------------------------- session


@router.get("", response_class=HTMLResponse)
def home(viewer: ViewerDep) -> Response:
    return RedirectResponse("/ui/datasets" if viewer else "/ui/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, services: ServicesDep) -> Response:
    """The login form; an anonymous session cookie carries its CSRF token."""
    anonymous = read_session(request, services.settings)
    if anonymous is None or anonymous.key_digest is not None:
        anonymous = new_session(None)
    response = _page("login.html", viewer=None, login_csrf=anonymous.csrf_token, error=None)
    set_session_cookie(response, anonymous, services.settings)
    return response


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, services: ServicesDep) -> Response:
    settings = services.settings
    current = read_session(request, settings)
    form = await _form(request)
    if not csrf_ok(request, current, form.get("csrf_token")):
        return _csrf_rejected()
    assert current is not None
    key = form.get("api_key", "").strip()
    with services.db.read_session() as db_session:
        tenant = tenant_for_key(db_session, key) if key else None
        tenant_id = tenant.id if tenant is not None else None
    if tenant_id is None:
        response = _page("login.html", viewer=None, status_code=401, login_csrf=current.csrf_token,
                         error="This API key is unknown or revoked.")
        return response
    response = RedirectResponse("/ui/datasets", status_code=303)
    set_session_cookie(response, new_session(key_digest(key)), settings)  # fresh token: no fixation
    log.info("dashboard login", extra={"tenant_id": tenant_id})
    return response


@router.post("/logout", response_class=HTMLResponse)
async def logout(request: Request, services: ServicesDep) -> Response:
    current = read_session(request, services.settings)
    form = await _form(request)
    if not csrf_ok(request, current, form.get("csrf_token")):
        return _csrf_rejected()
    response = _login_redirect()
    clear_session_cookie(response, services.settings)
    return response


# ---------------------------------------------------------------------------------- datasets


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(viewer: ViewerDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    rows = db_session.execute(
        select(Dataset, PrivacyBudget).join(PrivacyBudget)
        .where(Dataset.tenant_id == viewer.tenant.id)
        .order_by(Dataset.created_at.desc(), Dataset.id.desc())
        .limit(PAGE_LIMIT)
    ).all()
    items = [{"dataset": d, "budget": ledger.budget_summary(b)} for d, b in rows]
    return _page("datasets.html", viewer=viewer, items=items, limit=PAGE_LIMIT)


@router.get("/datasets/{dataset_id}", response_class=HTMLResponse)
def dataset_page(dataset_id: str, viewer: ViewerDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    dataset = dataset_of_tenant(db_session, viewer.tenant, dataset_id)
    budget = db_session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    entries = list(db_session.scalars(
        select(LedgerEntry).where(LedgerEntry.dataset_id == dataset.id).order_by(LedgerEntry.seq)
    ))
    opening_epsilon, opening_delta = opening_budget(db_session, budget)
    history = ledger_history(entries, opening_epsilon=opening_epsilon, opening_delta=opening_delta)
    ledger_svg = None
    if history:
        ledger_svg = Markup(plots.ledger_timeline_svg(
            times=[p.created_at for p in history],
            committed=[p.committed_epsilon for p in history],
            total=[p.total_epsilon for p in history],
            budget=[p.budget_epsilon for p in history],
        ))
    jobs = list(db_session.scalars(
        select(Job).where(Job.dataset_id == dataset.id, Job.tenant_id == viewer.tenant.id)
        .order_by(Job.created_at.desc()).limit(PAGE_LIMIT)
    ))
    return _page("dataset.html", viewer=viewer, dataset=dataset, budget=ledger.budget_summary(budget),
                 history=list(reversed(history)), ledger_svg=ledger_svg, jobs=jobs)


# ---------------------------------------------------------------------------------- jobs


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(viewer: ViewerDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    jobs = list(db_session.scalars(
        select(Job).where(Job.tenant_id == viewer.tenant.id)
        .order_by(Job.created_at.desc(), Job.id.desc()).limit(PAGE_LIMIT)
    ))
    names = dict(db_session.execute(
        select(Dataset.id, Dataset.name).where(Dataset.tenant_id == viewer.tenant.id)
    ).all())
    live = [j.id for j in jobs if j.status not in TERMINAL_STATUSES][:LIVE_STREAMS]
    return _page("jobs.html", viewer=viewer, jobs=jobs, dataset_names=names, live=live)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, viewer: ViewerDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    dataset = db_session.get(Dataset, job.dataset_id)
    events = list(db_session.scalars(
        select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.seq.desc()).limit(200)
    ))
    return _page("job.html", viewer=viewer, job=job, dataset=dataset, events=events,
                 live=job.status not in TERMINAL_STATUSES)


@router.get("/jobs/{job_id}/report", response_class=HTMLResponse)
def job_report_page(job_id: str, viewer: ViewerDep, services: ServicesDep, db_session: SessionDep) -> Response:
    if viewer is None:
        return _login_redirect()
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    if job.status != "succeeded" or job.report_blob is None:
        raise Problem(status=409, slug="job-not-succeeded",
                      detail=f"a report exists only for succeeded jobs; this job is {job.status}")
    report = json.loads(services.blobs.path(job.report_blob).read_text())
    return html_report_response(db_session, job, report, viewer_tenant_id=viewer.tenant.id,
                                dashboard_links=True)


@router.get("/jobs/{job_id}/events")
def job_event_source(
    job_id: str,
    viewer: ViewerDep,
    services: ServicesDep,
    db_session: SessionDep,
    after: Annotated[int, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """The job's events as Server-Sent Events for the dashboard's EventSource (cookie auth);
    the same stream as ``GET /v1/jobs/{id}/events`` with ``Accept: text/event-stream``."""
    if viewer is None:
        raise Problem(status=401, slug="unauthorized", detail="log in at /ui/login")
    job = job_of_tenant(db_session, viewer.tenant, job_id)
    if last_event_id and last_event_id.strip().isdigit():  # a reconnect resumes where it stopped
        after = max(after, int(last_event_id.strip()))
    db_session.close()
    settings = services.settings
    timing = StreamTiming(poll_interval_s=settings.sse_poll_interval_s, keepalive_s=settings.sse_keepalive_s,
                          max_stream_s=settings.sse_max_stream_s)
    return StreamingResponse(
        job_event_stream(db=services.db, job_id=job.id, after=min(after, 2**62), timing=timing),
        media_type=EVENT_STREAM_MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )

