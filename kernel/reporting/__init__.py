"""Human-readable views of the privacy report and the ledger: HTML pages and server-side plots.

Torch-free like the rest of the kernel. matplotlib is imported lazily (only when a page with a plot
is rendered), so the API starts as fast as before and a JSON-only client never pays for it.
"""

from kernel.reporting.html_report import CONTENT_SECURITY_POLICY, render_report_html
from kernel.reporting.job_report import report_html_for_job
from kernel.reporting.ledger_history import LedgerPoint, ledger_history, opening_budget
from kernel.reporting.step_series import SeriesUnavailable, StepSeries, epsilon_by_steps

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "LedgerPoint",
    "SeriesUnavailable",
    "StepSeries",
    "epsilon_by_steps",
    "ledger_history",
    "opening_budget",
    "render_report_html",
    "report_html_for_job",
]
