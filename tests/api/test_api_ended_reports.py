"""Every ε spent has a report (issue 35.4). A job cancelled while running, failed after a worker
opened the data, lost by its worker on its last attempt (the reconciler), or cancelled after a lost
attempt commits ε and releases no model: its report (JSON, HTML, dashboard) states what it
committed and why it ended, with its single-job ε for the event it committed (the steps it ran,
never the plan). No model is released. A job that committed nothing keeps answering 409."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry, utcnow
from kernel.jobs import lifecycle
from kernel.ledger import operations as ledger
from kernel.reconciler import reconcile_once
from kernel.reporting.privacy_report import closed_form_single_job_epsilon, report_single_job_epsilon
from privtrain.cli import CliEnvironment, cli
from privtrain_common.directed_rounding import format_guarantee
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import RecordingDispatcher, to_csv, upload
from tests.tuning_run import TRIAL_TIME_LIMIT_S, run_slots, run_tuning
from tests.ui.html_probe import parse, text_of
from worker.runner import JobRunner

DELTA = 1e-5


@pytest.fixture
def small_dataset(alice: TestClient) -> str:
    """300 rows, 4 features, two classes; ε_G = 8, δ_G = 1e-5."""
    rng = np.random.default_rng(3)
    X = rng.random((300, 4))
    response = upload(alice, to_csv(X, (X[:, 0] > 0.5).astype(int)), name="small")
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _spec(dataset_id: str, *, steps: int = 20) -> dict[str, Any]:
    """A fixed σ and a DP evaluation: a cancelled run commits its steps without the evaluation."""
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.5},
        "training": {"steps": steps, "batch_size": 32, "learning_rate": 0.5},
        "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5},
    }


def _submit(client: TestClient, spec: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    return dict(response.json())


def _commit(database: Database, job_id: str) -> LedgerEntry:
    with database.read_session() as session:
        entry = session.scalar(
            select(LedgerEntry).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == ledger.COMMIT)
        )
    assert entry is not None
    return entry


def _cli(client: TestClient, *args: str) -> Result:
    key = client.headers["Authorization"].removeprefix("Bearer ")
    result = CliRunner().invoke(
        cli,
        list(args),
        obj=CliEnvironment(transport=AppTransport(client)),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


def _block(result: Result) -> dict[str, str]:
    lines = result.stdout.split("\n\n")[0].splitlines()
    return dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines)


def _assert_ledger_view(report: dict[str, Any], entry: LedgerEntry) -> None:
    """The same before / this job's charge / after view as a success's report."""
    ledger_view = report["ledger"]
    assert ledger_view["commit_entry_seq"] == entry.seq and ledger_view["commit_entry_hash"] == entry.hash
    assert ledger_view["before"]["entries"] == entry.seq - 1
    assert ledger_view["charge"]["epsilon_committed"] == report["epsilon"]["ledger"]
    assert ledger_view["charge"]["rdp_curve"]["values"] == list(entry.curve) == report["rdp_curve"]["values"]
    assert ledger_view["after"]["committed_epsilon"] >= report["epsilon"]["ledger"]
    assert ledger_view["after"]["remaining_epsilon"] < ledger_view["before"]["remaining_epsilon"]


def _assert_no_model(client: TestClient, job_id: str) -> None:
    for path in (f"/v1/jobs/{job_id}/model",):
        response = client.get(path)
        assert response.status_code == 409 and response.json()["type"] == "/problems/job-not-succeeded"
    view = client.get(f"/v1/jobs/{job_id}").json()
    assert "model" not in view["links"] and view["links"]["report"] == f"/v1/jobs/{job_id}/report"


def _assert_html_and_dashboard(client: TestClient, job_id: str, report: dict[str, Any]) -> None:
    page = parse(client.get(f"/v1/jobs/{job_id}/report", params={"format": "html"}).text)
    assert text_of(page.by_id("guarantee")) == report["guarantee"]
    charged = "the steps it ran" if report["outcome"]["charged"] == "steps-run" else "its whole reservation"
    assert text_of(page.by_id("outcome")).endswith(f"released no model and no metric. It was charged {charged}.")
    assert text_of(page.by_id("no-model")).startswith("none: the job")
    assert float(page.by_id("epsilon-single-job").attrs["data-value"]) == report["epsilon"]["single_job"]
    assert float(page.by_id("epsilon-ledger").attrs["data-value"]) == report["epsilon"]["ledger"]
    assert "No metric was released" in text_of(page.by_id("released-metrics"))
    # the dashboard links it, and its link opens the page (not problem JSON)
    job_page = parse(client.get(f"/ui/jobs/{job_id}").text)
    (link,) = [e for e in job_page.elements if e.attrs.get("class") == "report-link"]
    assert "hidden" not in link.attrs and link.attrs["href"] == f"/ui/jobs/{job_id}/report"
    shown = client.get(f"/ui/jobs/{job_id}/report")
    assert shown.status_code == 200 and shown.headers["content-type"].startswith("text/html")
    assert text_of(parse(shown.text).by_id("guarantee")) == report["guarantee"]
    listed = parse(client.get("/ui/jobs").text)
    links = [e for e in listed.elements if e.attrs.get("href") == f"/ui/jobs/{job_id}/report"]
    assert links and all("hidden" not in e.attrs for e in links)


# ---------------------------------------------------------------------- cancelled while running


def test_a_job_cancelled_while_running_reports_the_steps_it_ran(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str, tmp_path: Path
) -> None:
    """The worker saw the cancel after 3 of 20 steps: the report, the job and the CLI state the
    3-step event's ledger ε and single-job ε (the plan's was shown before: 0.842 for 0.574)."""
    job = _submit(alice, _spec(small_dataset))
    planned_single_job = job["epsilon_single_job"]
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=3) == "cancelled"

    entry = _commit(database, job["id"])
    three_steps = report_single_job_epsilon(entry.event, delta=DELTA, algorithm="dp-sgd")
    plan = report_single_job_epsilon(claimed.job.event, delta=DELTA, algorithm="dp-sgd")
    assert three_steps.epsilon < plan.epsilon and three_steps.epsilon < planned_single_job

    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "cancelled" and final["steps_run"] == 3
    assert final["epsilon_single_job"] == final["epsilon_prv"] == three_steps.epsilon
    assert final["epsilon_single_job"] <= final["epsilon_committed"] < final["epsilon_reserved"]

    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["status"] == "cancelled" and report["job_id"] == job["id"]
    assert report["outcome"] == {
        "status": "cancelled",
        "charged": "steps-run",
        "model_released": False,
        "metrics_released": False,
        "error_code": None,
        "statement": report["outcome"]["statement"],
    }
    assert report["event"] == entry.event and report["reserved_event"] == claimed.job.event
    assert report["epsilon"]["ledger"] == final["epsilon_committed"] == ledger.curve_epsilon(entry.curve, DELTA)
    assert report["epsilon"]["reserved"] == final["epsilon_reserved"]
    assert report["epsilon"]["single_job"] == report["epsilon"]["prv_upper_bound"] == three_steps.epsilon
    assert report["epsilon"]["single_job_method"] == three_steps.method
    assert report["mechanism"]["steps_run"] == report["mechanism"]["steps_charged"] == 3
    assert report["mechanism"]["steps_planned"] == 20
    assert report["model"]["released"] is False and report["model"]["sha256"] is None
    assert report["released_metrics"] is None and "execution" not in report
    committed = format_guarantee(final["epsilon_committed"])
    assert report["guarantee"].startswith(f"({committed}, 1e-05)-differential privacy for one row")
    assert "cancelled while running, after 3 of 20 steps" in report["guarantee"]
    assert report["guarantee"].endswith("No model and no metric were released")
    assert report["ledger"]["charge"]["rest_of_reservation_released"] is True
    _assert_ledger_view(report, entry)
    assert report["dataset"]["sha256"]  # the owner's copy

    _assert_no_model(alice, job["id"])
    _assert_html_and_dashboard(alice, job["id"], report)
    page = parse(alice.get(f"/v1/jobs/{job['id']}/report", params={"format": "html"}).text)
    assert page.by_id("plot-epsilon-steps") is not None  # ε against the 3 steps it ran

    shown = _block(_cli(alice, "jobs", "show", job["id"]))
    assert shown["ε (single job, tightest)"] == format_guarantee(three_steps.epsilon)
    out = _cli(alice, "jobs", "download", job["id"], "--out", str(tmp_path))
    assert json.loads((tmp_path / f"{job['id']}.report.json").read_text()) == report
    assert not (tmp_path / f"{job['id']}.safetensors").exists()
    assert _block(out)["model"] == "none: the job was cancelled"


# ---------------------------------------------------------------------- failed after TOUCH


def test_a_job_that_failed_after_opening_the_data_reports_its_whole_reservation(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    job = _submit(alice, _spec(small_dataset))
    with mock.patch("worker.train.get_trainer", return_value=mock.Mock(side_effect=RuntimeError("boom"))):
        assert JobRunner(settings, db=database).run(job["id"]) == "failed"
    entry = _commit(database, job["id"])
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["error_code"] == "training-failed"
    assert final["epsilon_committed"] == final["epsilon_reserved"]
    whole = closed_form_single_job_epsilon(entry.event, delta=DELTA, algorithm="dp-sgd")
    assert final["epsilon_single_job"] == whole.epsilon == job["epsilon_single_job"]  # the committed event is the plan

    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["status"] == "failed" and report["event"] == report["reserved_event"] == entry.event
    assert report["outcome"]["error_code"] == "training-failed" and report["outcome"]["charged"] == "whole-reservation"
    assert "It failed (training-failed) after a worker had opened the data" in report["guarantee"]
    assert report["epsilon"]["ledger"] == report["epsilon"]["reserved"] == final["epsilon_committed"]
    assert report["epsilon"]["single_job"] == whole.epsilon and report["epsilon"]["single_job_method"] == whole.method
    assert report["mechanism"]["steps_charged"] == 20
    assert report["ledger"]["charge"]["rest_of_reservation_released"] is False
    assert report["noise"]["gaussian_secure_mode"] is True
    _assert_ledger_view(report, entry)
    _assert_no_model(alice, job["id"])
    _assert_html_and_dashboard(alice, job["id"], report)
    events = alice.get(f"/v1/jobs/{job['id']}/events").json()
    assert events[-1]["kind"] == "failed" and events[-1]["payload"] == {"error_code": "training-failed", "report": True}


# ---------------------------------------------------------------------- the reconciler


def _lose_the_worker(database: Database, job_id: str, *, attempt: int, settings: Settings) -> None:
    """What a claim (TOUCH) and a worker that stopped beating leave behind."""
    with database.write_transaction() as tx:
        job = tx.get(Job, job_id)
        assert job is not None
        budget = ledger.lock_budget(tx, job.dataset_id)
        if job.touched_at is None:
            ledger.touch(tx, budget, job=job, actor="worker:test")
        job.status, job.attempt, job.touched_at = "running", attempt, utcnow()
        job.heartbeat_at = utcnow() - dt.timedelta(seconds=settings.stale_after_s + 5)


def test_a_job_lost_on_its_last_attempt_gets_a_report_from_the_reconciler(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    job = _submit(alice, _spec(small_dataset))
    _lose_the_worker(database, job["id"], attempt=settings.max_attempts, settings=settings)
    assert reconcile_once(database, settings, RecordingDispatcher()).failed == (job["id"],)
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["status"] == "failed" and report["outcome"]["error_code"] == "worker-lost"
    assert "Its worker was lost on its last attempt (worker-lost)" in report["guarantee"]
    assert report["noise"]["gaussian_secure_mode"].startswith("not known")  # no worker settled it
    assert report["epsilon"]["single_job"] == alice.get(f"/v1/jobs/{job['id']}").json()["epsilon_single_job"]
    _assert_ledger_view(report, _commit(database, job["id"]))
    _assert_no_model(alice, job["id"])
    _assert_html_and_dashboard(alice, job["id"], report)


def test_a_queued_job_cancelled_after_a_lost_attempt_gets_a_report(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    job = _submit(alice, _spec(small_dataset))
    _lose_the_worker(database, job["id"], attempt=1, settings=settings)
    assert reconcile_once(database, settings, RecordingDispatcher()).requeued == (job["id"],)
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["status"] == "cancelled" and report["outcome"]["charged"] == "whole-reservation"
    assert "after a worker that had opened the data was lost" in report["guarantee"]
    assert report["epsilon"]["ledger"] == report["epsilon"]["reserved"]
    _assert_ledger_view(report, _commit(database, job["id"]))
    _assert_no_model(alice, job["id"])


# ---------------------------------------------------------------------- budget units


def test_budget_unit_jobs_report_the_units_they_spent(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """adaptive-noisy-gd: one that ends by itself early (a success) and one cancelled after 40 of its
    1000 units both state the single-job ε of the units they ran, below the plan's."""
    spec = {
        "dataset_id": small_dataset,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "adaptive-noisy-gd", "hyperparameters": {"L0": 3.0, "L1": 2.0}},
        "privacy": {"target_epsilon": 1.5},
        "training": {"steps": 3},
    }
    runner = JobRunner(settings, db=database)
    ended = _submit(alice, spec)
    assert runner.run(ended["id"]) == "succeeded"
    report = alice.get(f"/v1/jobs/{ended['id']}/report").json()
    assert report["mechanism"]["steps_run"] < report["mechanism"]["steps_planned"]
    ran = report_single_job_epsilon(report["event"], delta=DELTA, algorithm="adaptive-noisy-gd")
    planned = report_single_job_epsilon(report["reserved_event"], delta=DELTA, algorithm="adaptive-noisy-gd")
    assert report["epsilon"]["single_job"] == ran.epsilon < planned.epsilon
    assert alice.get(f"/v1/jobs/{ended['id']}").json()["epsilon_single_job"] == ran.epsilon

    cancelled = _submit(alice, spec)
    claimed = runner.claim(cancelled["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=40) == "cancelled"
    report = alice.get(f"/v1/jobs/{cancelled['id']}/report").json()
    assert "after 40 of 1000 budget units" in report["guarantee"]
    ran = report_single_job_epsilon(report["event"], delta=DELTA, algorithm="adaptive-noisy-gd")
    assert report["epsilon"]["single_job"] == ran.epsilon < planned.epsilon
    _assert_no_model(alice, cancelled["id"])


# ---------------------------------------------------------------------- nothing committed


def test_a_job_that_spent_nothing_has_no_report_and_says_why(alice: TestClient, small_dataset: str) -> None:
    job = _submit(alice, _spec(small_dataset))
    queued = alice.get(f"/v1/jobs/{job['id']}/report")
    assert queued.status_code == 409 and "once it has ended" in queued.json()["detail"]
    cancelled = alice.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert cancelled["epsilon_single_job"] == 0.0 and "report" not in cancelled["links"]
    for params in ({}, {"format": "html"}):
        response = alice.get(f"/v1/jobs/{job['id']}/report", params=params)
        assert response.status_code == 409 and response.json()["type"] == "/problems/job-not-succeeded"
        assert "spent nothing" in response.json()["detail"]
    page = parse(alice.get(f"/ui/jobs/{job['id']}").text)
    (link,) = [e for e in page.elements if e.attrs.get("class") == "report-link"]
    assert "hidden" in link.attrs and text_of(page.by_id("no-report")) == "none: this job spent nothing"
    dashboard = alice.get(f"/ui/jobs/{job['id']}/report")  # a page that explains, not problem JSON
    assert dashboard.status_code == 409 and dashboard.headers["content-type"].startswith("text/html")
    assert "spent nothing" in dashboard.text


def test_a_job_cancelled_before_reports_existed_states_no_single_job_epsilon(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """A row settled by an older release still holds its plan's single-job ε: it is not shown as spent."""
    job = _submit(alice, _spec(small_dataset))
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=3) == "cancelled"
    with database.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job["id"]).values(report_blob=None, epsilon_prv=job["epsilon_prv"]))
    legacy = alice.get(f"/v1/jobs/{job['id']}").json()
    assert legacy["epsilon_single_job"] is None and legacy["epsilon_prv"] is None
    response = alice.get(f"/v1/jobs/{job['id']}/report")
    assert response.status_code == 409 and "no stored privacy report" in response.json()["detail"]


def test_an_analyst_gets_the_report_without_the_content_hash(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str, bob_headers: dict[str, str]
) -> None:
    alice.post(f"/v1/datasets/{small_dataset}/grants", json={"tenant": "bob"})
    bob = TestClient(alice.app, headers=bob_headers)
    assert bob.post(f"/v1/invitations/{small_dataset}/accept").status_code in (200, 202)
    job = _submit(bob, _spec(small_dataset))
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=2) == "cancelled"
    owner, analyst = (c.get(f"/v1/jobs/{job['id']}/report").json() for c in (alice, bob))
    assert owner["dataset"]["sha256"] and "sha256" not in analyst["dataset"]
    assert analyst["epsilon"] == owner["epsilon"] and analyst["outcome"] == owner["outcome"]


def test_privacy_event_json_round_trips_in_every_ended_report(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """The committed event in the report re-prices to the ledger ε stated beside it."""
    job = _submit(alice, _spec(small_dataset))
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=5) == "cancelled"
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    curve = privacy.rdp_curve(privacy.event_from_json(report["event"]))
    assert ledger.curve_epsilon(curve, DELTA) == report["epsilon"]["ledger"]


# ---------------------------------------------------------------------- private tunings


def _tuning_request(dataset_id: str) -> dict[str, Any]:
    base = {**_spec(dataset_id, steps=5), "privacy": {"target_epsilon": 1.0}}
    base["training"] = {**base["training"], "time_limit_s": TRIAL_TIME_LIMIT_S}
    return {
        "base": base,
        "search_space": {"training.learning_rate": [0.05, 0.5], "training.steps": [5, 10]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }


def _assert_counts_no_trials(report: dict[str, Any]) -> None:
    """Nothing that counts trials: no steps run, no durations, no error code, no execution (the
    tuning's public schedule, the same whatever K is, aside)."""
    assert set(report["tuning"]["schedule"]) == {"slots", "trial_time_limit_s", "slot_seconds", "parallel_slots"}
    text = json.dumps({**report, "tuning": {**report["tuning"], "schedule": None}})
    assert "steps_run" not in text and "steps_charged" not in text and "seconds" not in text
    assert "execution" not in report and "error_code" not in report["outcome"]
    assert report["mechanism"] is None and report["outcome"]["charged"] == "whole-reservation"
    assert not re.search(r"\b(ran|steps?|trials? ran)\b \d", report["guarantee"])
    assert report["tuning"]["trials"]["count"].startswith("not shown")
    assert report["tuning"]["selected"] is None and report["tuning"]["selected_metric"] is None


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
def test_a_tuning_that_ended_without_success_reports_its_charge_and_counts_no_trials(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str, ending: str
) -> None:
    body = alice.post("/v1/tuning-jobs", json=_tuning_request(small_dataset)).json()
    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=2),
        mock.patch("worker.slot_runner.SlotRunner._run_trial", side_effect=RuntimeError("boom")),
    ):
        if ending == "cancelled":  # while its slots wait: it ends at once, in the API's transaction
            assert JobRunner(settings, db=database).run(body["job_id"]) == "opened"
            assert alice.post(f"/v1/tuning-jobs/{body['id']}/cancel").json()["status"] == "cancelled"
            assert set(run_slots(settings, database, body["job_id"]).values()) == {"skipped"}
        else:
            assert run_tuning(settings, database, body["job_id"]) == "failed"
    entry = _commit(database, body["job_id"])
    report = alice.get(f"/v1/jobs/{body['job_id']}/report").json()
    assert report["status"] == ending and report["event"] == report["reserved_event"] == entry.event
    assert report["epsilon"]["ledger"] == report["epsilon"]["reserved"] == body["epsilon_reserved"]
    assert report["epsilon"]["single_job_method"] in {"rdp-single-job", "rdp"}  # a tuning's curve only
    assert "private hyperparameter tuning ended" in report["guarantee"]
    _assert_counts_no_trials(report)
    _assert_ledger_view(report, entry)
    _assert_no_model(alice, body["job_id"])
    _assert_html_and_dashboard(alice, body["job_id"], report)
    view = alice.get(f"/v1/tuning-jobs/{body['id']}").json()
    assert view["links"]["report"] == f"/v1/jobs/{body['job_id']}/report" and "model" not in view["links"]
    page = parse(alice.get(f"/v1/jobs/{body['job_id']}/report", params={"format": "html"}).text)
    assert not [e for e in page.elements if e.attrs.get("id") == "steps-run"]
    assert text_of(page.by_id("mechanism-unavailable")).startswith("Not stated: a tuning's trials")
    assert "steps run" not in text_of(page.elements[0]).lower()


def test_a_report_that_cannot_be_stored_never_blocks_the_charge(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """The ledger must record what was spent even when its report cannot be built."""
    job = _submit(alice, _spec(small_dataset))
    claimed = JobRunner(settings, db=database).claim(job["id"])
    assert claimed is not None

    def broken(record: lifecycle.CommitRecord) -> lifecycle.EndedReport:
        raise RuntimeError("the report cannot be built")

    assert lifecycle.fail(
        database, attempt=claimed.held, error_code="training-failed", actor="worker:test", write_report=broken
    )
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "failed" and final["epsilon_committed"] == final["epsilon_reserved"]
    assert final["epsilon_single_job"] == job["epsilon_single_job"]  # whole reservation: the plan's is of it
    assert "report" not in final["links"]
    assert "no stored privacy report" in alice.get(f"/v1/jobs/{job['id']}/report").json()["detail"]
    events = alice.get(f"/v1/jobs/{job['id']}/events").json()
    assert events[-1]["payload"] == {"error_code": "training-failed"}


def test_the_worker_keeps_a_cancelled_jobs_heartbeat_while_its_accountant_runs(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """The numeric single-job ε may take up to its 120 s cap, more than stale_after_s: without
    heartbeats the reconciler would fail the cancelled job and charge its whole reservation."""
    job = _submit(alice, _spec(small_dataset))
    runner = JobRunner(settings.model_copy(update={"heartbeat_interval_s": 0.1}), db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None
    long_ago = utcnow() - dt.timedelta(hours=1)
    with database.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job["id"]).values(heartbeat_at=long_ago))

    def slow(event: dict[str, Any], *, delta: float, algorithm: str) -> privacy.SingleJobEpsilon:
        time.sleep(0.5)
        return report_single_job_epsilon(event, delta=delta, algorithm=algorithm)

    with mock.patch("worker.single_job_prefetch.report_single_job_epsilon", side_effect=slow):
        assert runner.settle_stopped(claimed, steps_run=3) == "cancelled"
    with database.read_session() as session:
        settled = session.get(Job, job["id"])
        assert settled is not None and settled.heartbeat_at is not None
        assert settled.heartbeat_at.replace(tzinfo=None) > long_ago.replace(tzinfo=None) + dt.timedelta(minutes=59)
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    assert report["outcome"]["charged"] == "steps-run" and report["mechanism"]["steps_run"] == 3
