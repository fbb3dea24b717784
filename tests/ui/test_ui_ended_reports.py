"""The dashboard for a job that ended without succeeding (issue 35.4): cancelled from its page while
it ran, it gets a report, which the job page, the jobs list and the dataset page link and which
opens as the HTML report (it showed raw problem JSON before); a job that spent nothing says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ui.conftest import UiWorld, csrf_token_of
from tests.ui.html_probe import parse, text_of

LIVE_TEMPLATE = Path(__file__).resolve().parents[2] / "kernel" / "reporting" / "templates" / "_live.html"


@pytest.fixture(scope="module")
def ended_dataset(ui_world: UiWorld) -> str:
    """Alice's own dataset for these tests: the shared world's jobs and ledger stay as the other
    modules expect them."""
    return ui_world.upload_dataset(ui_world.alice_key, name="ended")


def _report_links(html: str, job_id: str) -> list[dict[str, str]]:
    return [e.attrs for e in parse(html).elements if e.attrs.get("href") == f"/ui/jobs/{job_id}/report"]


def test_a_job_cancelled_from_its_page_while_running_gets_a_linked_report(
    ui_world: UiWorld, ended_dataset: str
) -> None:
    from worker.runner import JobRunner

    job_id = ui_world.submit_job(ui_world.alice_key, dataset_id=ended_dataset, steps=10)
    runner = JobRunner(ui_world.settings, db=ui_world.db)
    claimed = runner.claim(job_id)
    assert claimed is not None
    browser = ui_world.logged_in(ui_world.alice_key)
    running = browser.get(f"/ui/jobs/{job_id}").text
    (link,) = _report_links(running, job_id)
    assert "hidden" in link  # no report while it runs
    token = csrf_token_of(running)
    assert browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token}).status_code == 303
    assert runner.settle_stopped(claimed, steps_run=2) == "cancelled"  # the worker sees the cancel

    page = browser.get(f"/ui/jobs/{job_id}").text
    (link,) = _report_links(page, job_id)
    assert "hidden" not in link
    assert "single-job ε (tightest bound) of what it committed" in text_of(parse(page).by_id("job-details"))
    for listing in ("/ui/jobs", f"/ui/datasets/{ended_dataset}"):
        links = _report_links(browser.get(listing).text, job_id)
        assert links and all("hidden" not in attrs for attrs in links), listing

    report = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{job_id}/report").json()
    shown = browser.get(f"/ui/jobs/{job_id}/report")
    assert shown.status_code == 200 and shown.headers["content-type"].startswith("text/html")
    html = parse(shown.text)
    assert text_of(html.by_id("guarantee")) == report["guarantee"]
    assert text_of(html.by_id("outcome")).startswith("This job was cancelled and released no model")
    assert text_of(html.by_id("no-model")).startswith("none: the job was cancelled")
    assert int(html.by_id("steps-run").attrs["data-value"]) == 2
    events = ui_world.client(ui_world.alice_key).get(f"/v1/jobs/{job_id}/events").json()
    assert events[-1]["kind"] == "cancelled" and events[-1]["payload"] == {"steps_run": 2, "report": True}
    # the live script shows the link when that event arrives, not only on success
    assert "payload.report === true" in LIVE_TEMPLATE.read_text()


def test_a_job_that_spent_nothing_says_so_instead_of_a_link(ui_world: UiWorld, ended_dataset: str) -> None:
    job_id = ui_world.submit_job(ui_world.alice_key, dataset_id=ended_dataset)
    browser = ui_world.logged_in(ui_world.alice_key)
    token = csrf_token_of(browser.get(f"/ui/jobs/{job_id}").text)
    assert browser.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": token}).status_code == 303
    page = parse(browser.get(f"/ui/jobs/{job_id}").text)
    assert text_of(page.by_id("no-report")) == "none: this job spent nothing"
    missing = browser.get(f"/ui/jobs/{job_id}/report")
    assert missing.status_code == 409 and missing.headers["content-type"].startswith("text/html")
    assert "spent nothing" in text_of(parse(missing.text).elements[0])
    with pytest.raises(json.JSONDecodeError):
        json.loads(missing.text)
