"""Privacy figures on the HTML report and the dashboard are rounded in the safe direction: a
guarantee (charged, reserved, committed ε; δ) never reads smaller than the exact value in its
``data-value``, a remaining budget never reads larger. Nearest rounding printed ε = 3.0000012
as ``3``. Each shown number is parsed and compared as a ``Decimal`` with the exact float."""

from __future__ import annotations

import copy
import datetime as dt
from decimal import Decimal
from types import SimpleNamespace

import pytest

from api.job_views import job_epsilon
from kernel.datasets.deletion import DeletionProgress
from kernel.datasets.status import DatasetStatus
from kernel.ledger.budget_gauge import BudgetGauge
from kernel.reporting.html_report import render_report_html
from kernel.reporting.ledger_history import LedgerPoint
from kernel.reporting.templating import render
from tests.ui.conftest import UiWorld
from tests.ui.html_probe import Element, Page, parse, text_of

GUARANTEE_FIELDS = {
    "epsilon",
    "delta",
    "committed_epsilon",
    "reserved_epsilon",
    "spent_epsilon",
    "job_epsilon",
    "epsilon_spent",
    "epsilon_reserved",
    "epsilon_single_job",
}
REMAINING_FIELDS = {"remaining_epsilon"}
REPORT_GUARANTEE_IDS = ("epsilon-ledger", "epsilon-single-job", "epsilon-rdp", "delta")

# nearest rounding gets every one of these wrong: 6 digits for the report, 4 on the dashboard
CHARGED, REMAINING = 3.0000012, 1.8318651  # report: nearest "3" and "1.83187"
CHARGED_4, REMAINING_4 = 3.00012, 1.83186  # dashboard: nearest "3" and "1.832"


def _shown(element: Element) -> Decimal:
    return Decimal(text_of(element))


def _check_fields(page: Page) -> int:
    """Every cell with a data-field: guarantees ≥ exact, remaining ≤ exact. Returns how many."""
    checked = 0
    for cell in page.with_attr("data-field"):
        field = cell.attrs["data-field"].split(".")[-1]
        if cell.attrs.get("data-value") in (None, "None"):
            continue
        exact = Decimal(repr(float(cell.attrs["data-value"])))
        if field in GUARANTEE_FIELDS:
            assert _shown(cell) >= exact, (cell.attrs["data-field"], text_of(cell), exact)
            checked += 1
        elif field in REMAINING_FIELDS:
            assert _shown(cell) <= exact, (cell.attrs["data-field"], text_of(cell), exact)
            checked += 1
    return checked


def _budget(*, committed: float, reserved: float, remaining: float) -> dict[str, object]:
    return {
        "dataset_id": "ds_1",
        "epsilon": 9.0,
        "delta": 1e-05,
        "committed_epsilon": committed,
        "reserved_epsilon": reserved,
        "spent_epsilon": committed + reserved,
        "remaining_epsilon": remaining,
        "entries": 4,
        "last_hash": "ab" * 32,
    }


def test_report_rounds_guarantees_up_and_the_remaining_budget_down(report_json: dict) -> None:
    report = copy.deepcopy(report_json)
    report["epsilon"].update(ledger=CHARGED, single_job=2.0000012, rdp_at_delta=1.0000012)
    report["rdp_curve"]["values"] = [v + 1.2e-6 for v in report["rdp_curve"]["values"]]
    report["ledger"]["before"] = _budget(committed=0.0, reserved=CHARGED, remaining=REMAINING + 3)
    report["ledger"]["after"] = _budget(committed=CHARGED, reserved=0.0, remaining=REMAINING)
    report["ledger"]["charge"]["epsilon_committed"] = CHARGED
    page = parse(render_report_html(report, history=[], steps=None))
    assert text_of(page.by_id("epsilon-ledger")) == "3.00001"  # nearest printed "3"
    for element_id in REPORT_GUARANTEE_IDS:
        cell = page.by_id(element_id)
        assert _shown(cell) >= Decimal(repr(float(cell.attrs["data-value"]))), element_id
    (remaining,) = page.with_attr("data-field", "after.remaining_epsilon")
    assert text_of(remaining) == "1.83186"  # nearest printed "1.83187", more than is left
    (charge,) = page.with_attr("data-field", "charge.committed_epsilon")
    assert text_of(charge) == "3.00001"  # the job's charge, beside before and after
    assert _check_fields(page) == 13
    curve = [e for e in page.inside(page.by_id("rdp-curve")) if "data-value" in e.attrs]
    assert curve and all(_shown(e) >= Decimal(repr(float(e.attrs["data-value"]))) for e in curve)


def _page_context() -> dict[str, object]:
    return {"nonce": "n", "csrf_token": "", "tenant_name": "alice", "epsilon_of": job_epsilon}


GAUGE = BudgetGauge(
    committed_percent=40.0,
    reserved_percent=10.0,
    free_percent=50.0,
    remaining_epsilon=REMAINING_4,
    remaining_if_released_epsilon=REMAINING_4 + 1,
)


def _job() -> SimpleNamespace:
    return SimpleNamespace(
        id="job_1",
        dataset_id="ds_1",
        status="succeeded",
        algorithm="dp-sgd",
        model_name="logistic-regression",
        steps_run=4,
        steps_planned=4,
        epsilon_ledger=CHARGED_4,
        epsilon_prv=2.50004,
        delta=1e-05,
        noise_multiplier=1.1,
        sampling_probability=0.01,
        error_code=None,
        metrics=None,
        spec={},
        created_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        epsilon_committed=CHARGED_4,
        attempt=1,
        cancel_requested=False,
        started_at=None,
        finished_at=None,
        report_blob="sha256/ab",
    )


def test_dashboard_pages_round_guarantees_up_and_the_remaining_budget_down() -> None:
    budget = _budget(committed=CHARGED_4, reserved=1.20004, remaining=REMAINING_4)
    dataset = SimpleNamespace(id="ds_1", name="d", n_rows=100, task="classification", sha256="0" * 64)

    datasets = parse(
        render(
            "datasets.html",
            items=[{"dataset": dataset, "budget": budget, "gauge": GAUGE, "shared_by": None}],
            limit=50,
            invitations=[],
            more_invitations=False,
            **_page_context(),
        )
    )
    assert _check_fields(datasets) == 3
    (committed,) = datasets.with_attr("data-field", "committed_epsilon")
    (remaining,) = datasets.with_attr("data-field", "remaining_epsilon")
    assert (text_of(committed), text_of(remaining)) == ("3.001", "1.831")  # nearest: "3", "1.832"

    point = LedgerPoint(
        seq=2,
        kind="COMMIT",
        job_id="job_1",
        actor="alice",
        created_at=dt.datetime(2024, 1, 1),
        hash="cd" * 32,
        entry_epsilon=CHARGED_4,
        committed_epsilon=CHARGED_4,
        total_epsilon=CHARGED_4,
        budget_epsilon=9.0,
        budget_delta=1e-05,
    )
    one = parse(
        render(
            "dataset.html",
            dataset=dataset,
            budget=budget,
            budget_bar=GAUGE,
            role="owner",
            shared_by=None,
            history=[point],
            ledger_svg=None,
            jobs=[_job()],
            deletion=DeletionProgress(status=DatasetStatus.ACTIVE, jobs_settling=0, models_pending=0),
            **_page_context(),
        )
    )
    assert _check_fields(one) == 5
    (row,) = one.with_attr("data-seq", "2")
    ledger_cells = [e for e in one.inside(row) if e.tag == "td" and e.attrs.get("class") == "num"]
    assert [text_of(e) for e in ledger_cells] == ["3.001"] * 3
    (gauge,) = [e for e in one.elements if e.attrs.get("class") == "gauge"]
    assert "committed 3.001," in gauge.attrs["aria-label"] and "remaining 1.831 " in gauge.attrs["aria-label"]

    jobs = parse(render("jobs.html", jobs=[_job()], dataset_names={}, live=[], live_config={}, **_page_context()))
    (cell,) = jobs.with_attr("data-field", "job_epsilon")
    assert text_of(cell) == "3.001"

    running = SimpleNamespace(**{**vars(_job()), "status": "running", "epsilon_committed": None})
    for job in (_job(), running):
        html = render(
            "job.html",
            job=job,
            spec=job.spec,
            dataset=None,
            events=[],
            live=job.status == "running",
            may_cancel=True,
            epsilon_spent=CHARGED_4,
            single_job=2.50004,
            live_config={},
            **_page_context(),
        )
        assert "at δ = 1e-05" in html  # a declared δ prints as it was typed
        page = parse(html)
        assert _check_fields(page) == (4 if job is running else 3)
        shown = {e.attrs["data-field"]: text_of(e) for e in page.with_attr("data-field")}
        assert shown["job_epsilon"] == "3.001"
        assert (shown["epsilon_reserved"], shown["epsilon_single_job"]) == ("3.00012", "2.50004")


@pytest.mark.parametrize("path", ["/ui/datasets", "/ui/datasets/{dataset_id}", "/ui/jobs/{job_id}/report"])
def test_the_worlds_pages_never_print_on_the_unsafe_side(ui_world: UiWorld, path: str) -> None:
    browser = ui_world.logged_in(ui_world.alice_key)
    html = browser.get(path.format(dataset_id=ui_world.dataset_id, job_id=ui_world.job_id)).text
    assert _check_fields(parse(html)) >= 3


def test_the_worlds_jobs_page_rounds_the_charged_epsilon_up(ui_world: UiWorld) -> None:
    page = parse(ui_world.logged_in(ui_world.alice_key).get("/ui/jobs").text)
    cells = page.with_attr("data-field", "job_epsilon")
    assert len(cells) >= 2
    assert all(_shown(e) >= Decimal(repr(float(e.attrs["data-value"]))) for e in cells)
