"""The privacy report as one self-contained HTML page an owner can hand to an auditor.

Rendered on demand from the stored JSON report (the worker's immutable, content-addressed blob),
the job's re-derived ε-by-steps series and the dataset's ledger entries up to the report's
snapshot; every number on the page is either copied from the JSON report or recomputed with
``kernel.privacy`` from public values. Nothing private is added: the JSON report holds none.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from kernel.reporting import plots
from kernel.reporting.ledger_history import LedgerPoint
from kernel.reporting.step_series import StepSeries
from kernel.reporting.templating import render

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
"""The standalone report needs no script, no fetch and no external asset."""


def _commit_index(history: list[LedgerPoint], seq: int) -> int | None:
    return next((i for i, point in enumerate(history) if point.seq == seq), None)


def render_report_html(
    report: dict[str, Any],
    *,
    history: list[LedgerPoint],
    steps: StepSeries | None,
    steps_unavailable: str | None = None,
    dashboard_links: bool = False,
    full_ledger: bool = True,
) -> str:
    """The page. ``history`` is the dataset's ledger up to the report's "after" snapshot.

    ``full_ledger`` False (the viewer is an analyst, not the dataset's owner): other tenants'
    jobs must not show, so the ledger table keeps only this job's entries and the budget's own
    (opening, raises), and the timeline plot — whose steps are other jobs' spends — is left out.
    """
    epsilon = report["epsilon"]
    mechanism = report.get("mechanism") or {}  # none in an ended tuning's report: it would count trials
    ledger_section = report["ledger"]
    steps_svg = None
    if steps is not None:
        steps_svg = Markup(
            plots.epsilon_vs_steps_svg(
                steps=steps.steps,
                epsilon=steps.epsilon,
                final_steps=int(mechanism.get("steps_charged", mechanism["steps_run"])),
                final_ledger=float(epsilon["ledger"]),
                final_prv=epsilon.get("single_job", epsilon.get("prv_upper_bound")),
                delta=float(epsilon["delta"]),
            )
        )
    rdp_svg = Markup(plots.rdp_curve_svg(orders=report["rdp_curve"]["orders"], values=report["rdp_curve"]["values"]))
    commit_index = _commit_index(history, int(ledger_section["commit_entry_seq"]))
    ledger_svg = None
    if history and full_ledger:
        ledger_svg = Markup(
            plots.ledger_timeline_svg(
                times=[p.created_at for p in history],
                committed=[p.committed_epsilon for p in history],
                total=[p.total_epsilon for p in history],
                budget=[p.budget_epsilon for p in history],
                marker_index=commit_index,
            )
        )
    commit_verified = commit_index is not None and history[commit_index].hash == ledger_section["commit_entry_hash"]
    step_table = []
    if steps is not None:
        marks = set(_table_indices(len(steps.steps)))
        step_table = [(k, e) for i, (k, e) in enumerate(zip(steps.steps, steps.epsilon, strict=True)) if i in marks]
    return render(
        "report.html",
        report=report,
        steps_svg=steps_svg,
        steps_unavailable=steps_unavailable,
        step_table=step_table,
        rdp_svg=rdp_svg,
        rdp_rows=list(zip(report["rdp_curve"]["orders"], report["rdp_curve"]["values"], strict=True)),
        ledger_svg=ledger_svg,
        history=history if full_ledger else [p for p in history if p.job_id is None or p.job_id == report["job_id"]],
        hidden_entries=0
        if full_ledger
        else sum(1 for p in history if p.job_id is not None and p.job_id != report["job_id"]),
        commit_verified=commit_verified,
        dashboard_links=dashboard_links,
    )


def _table_indices(length: int, rows: int = 8) -> list[int]:
    """About ``rows`` evenly spaced indices including the first and the last."""
    if length <= rows:
        return list(range(length))
    return sorted({round(i * (length - 1) / (rows - 1)) for i in range(rows)})
