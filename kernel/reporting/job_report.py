"""Gather what the HTML report needs for one job from the database and render it.

Why on demand in the API (and not a second blob written by the worker): the page is a pure
function of the immutable JSON report, the job's public spec and the dataset's append-only ledger
up to the report's snapshot, so no new column, migration or worker dependency is needed, and
reports of old jobs get the current template. Renders are memoised per (job, report content,
ledger head) because the plots take a few hundred milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.db.orm import Dataset, Job, LedgerEntry, PrivacyBudget, Tenant
from kernel.ledger.explanations import jobs_of
from kernel.reporting.html_report import render_report_html
from kernel.reporting.init_visibility import chain_levels
from kernel.reporting.ledger_history import ledger_history, opening_budget
from kernel.reporting.privacy_report import public_report_html
from kernel.reporting.redaction import report_for_viewer
from kernel.reporting.step_series import SeriesUnavailable, StepSeries, epsilon_by_steps

_CACHE: OrderedDict[tuple[str, str, str, bool, bool], str] = OrderedDict()
_CACHE_SIZE = 32
_CACHE_LOCK = threading.Lock()


def report_html_for_job(
    session: Session,
    job: Job,
    report: dict[str, Any],
    *,
    viewer_tenant_id: str,
    dashboard_links: bool = False,
) -> str:
    """The HTML page of a job's report (a succeeded job's, or one that ended otherwise having
    committed ε; the caller checked access); the dataset's whole ledger shows only when the viewer
    owns the dataset."""
    dataset = session.get(Dataset, job.dataset_id)
    budget = session.get(PrivacyBudget, job.dataset_id)
    assert dataset is not None and budget is not None
    full_ledger = dataset.tenant_id == viewer_tenant_id
    viewer = session.get(Tenant, viewer_tenant_id)
    assert viewer is not None
    levels = chain_levels(session, viewer, report.get("init"))
    report = report_for_viewer(report, viewer_owns_dataset=full_ledger, init_levels=levels)
    if report.get("public_dataset"):  # no ε, no ledger: a plain page says so
        return public_report_html(report)
    content = hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()
    key = (job.id, content, budget.last_hash, dashboard_links, full_ledger)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    snapshot = int(report["ledger"]["after"]["entries"])
    entries = list(
        session.scalars(
            select(LedgerEntry)
            .where(LedgerEntry.dataset_id == dataset.id, LedgerEntry.seq <= snapshot)
            .order_by(LedgerEntry.seq)
        )
    )
    opening_epsilon, opening_delta = opening_budget(session, budget)
    history = ledger_history(
        entries, opening_epsilon=opening_epsilon, opening_delta=opening_delta, jobs=jobs_of(session, entries)
    )
    steps: StepSeries | None = None
    unavailable: str | None = None
    try:
        steps = epsilon_by_steps(job, dataset, report)
    except SeriesUnavailable as exc:
        unavailable = str(exc)
    html = render_report_html(
        report,
        history=history,
        steps=steps,
        steps_unavailable=unavailable,
        dashboard_links=dashboard_links,
        full_ledger=full_ledger,
    )
    with _CACHE_LOCK:
        _CACHE[key] = html
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return html
