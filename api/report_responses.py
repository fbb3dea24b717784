"""The HTTP response of an HTML report: strict CSP, a download name, no caching by proxies."""

from __future__ import annotations

from typing import Any

from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from kernel.db.orm import Job
from kernel.reporting.html_report import CONTENT_SECURITY_POLICY
from kernel.reporting.job_report import report_html_for_job


def html_report_response(
    session: Session,
    job: Job,
    report: dict[str, Any],
    *,
    viewer_tenant_id: str,
    dashboard_links: bool = False,
) -> HTMLResponse:
    html = report_html_for_job(session, job, report, viewer_tenant_id=viewer_tenant_id, dashboard_links=dashboard_links)
    return HTMLResponse(
        html,
        headers={
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "Content-Disposition": f'inline; filename="{job.id}-privacy-report.html"',
            "Cache-Control": "private, no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        },
    )
