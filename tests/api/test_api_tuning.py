"""Private hyperparameter tuning through the API and the worker's JobRunner: one ledger entry for
the whole tuning (Papernot-Steinke's bound over the pool's costliest configuration, with K
conditioned on its public maximum), trials drawn when the tuning opens and run in its slots with
a number K the server draws and never shows, only the best trial released as an ordinary job; a
failed, cancelled or trial-less tuning commits its whole charge."""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import select

from algorithms.trainers import TrainingRequest
from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import LedgerEntry
from kernel.jobs import lifecycle
from kernel.ledger.audit import verify_ledger
from kernel.privacy.events import BoundedTruncatedNegativeBinomial
from privtrain.cli import CliEnvironment, cli
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.conftest import counts, upload
from tests.tuning_run import run_slots, run_tuning, tuning_request, tuning_settings
from worker import job_data
from worker.runner import JobRunner

_request = tuning_request


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return tuning_settings(tmp_path / "data")


@pytest.fixture
def dataset_id(alice: TestClient, digits_csv: bytes) -> str:
    return str(upload(alice, digits_csv).json()["id"])  # type: ignore[attr-defined]


def _entries(database: Database, dataset_id: str) -> list[LedgerEntry]:
    with database.read_session() as session:
        return list(session.scalars(select(LedgerEntry).where(LedgerEntry.dataset_id == dataset_id)))


def test_a_tuning_is_one_ledger_entry_priced_by_the_papernot_steinke_bound(
    alice: TestClient, dataset_id: str, database: Database
) -> None:
    estimate = alice.post("/v1/tuning-jobs/estimate", json=_request(dataset_id)).json()
    assert len(estimate["candidates"]) == 6  # the whole 3 × 2 grid
    assert estimate["epsilon_one_trial"] < estimate["epsilon_ledger"]
    assert estimate["trials"]["maximum"] == 3 and estimate["trials"]["expected"] == pytest.approx(1.5)
    assert estimate["schedule"] == {
        "slots": 3,
        "slots_done": 0,
        "trial_time_limit_s": 3.0,
        "slot_seconds": 5.0,
        "parallel_slots": 4,
        "worker_seconds": 15.0,
    }
    created = alice.post("/v1/tuning-jobs", json=_request(dataset_id))
    assert created.status_code == 202, created.text
    body = created.json()
    assert body["status"] == "queued" and body["best_job_id"] is None
    assert body["epsilon_ledger"] == pytest.approx(estimate["epsilon_ledger"])
    assert body["trials"]["count_shown"] is False and body["trials"]["expected"] == pytest.approx(1.5)
    reserves = [e for e in _entries(database, dataset_id) if e.kind == "RESERVE"]
    assert len(reserves) == 1
    event = privacy.event_from_json(reserves[0].event)
    assert isinstance(event, privacy.HyperparameterTuningEvent) and len(event.candidates) == 6
    assert isinstance(event.distribution, BoundedTruncatedNegativeBinomial) and event.distribution.maximum == 3
    assert privacy.ledger_epsilon(privacy.rdp_curve(event), 1e-5) == pytest.approx(body["epsilon_ledger"])
    # The maximum's conditioning is charged: the same event without it costs less.
    unbounded = privacy.HyperparameterTuningEvent(event.distribution.unbounded, event.candidates)
    assert privacy.ledger_epsilon(privacy.rdp_curve(unbounded), 1e-5) < body["epsilon_ledger"]
    assert alice.get(f"/v1/tuning-jobs/{body['id']}").json()["id"] == body["id"]
    assert [item["id"] for item in alice.get("/v1/tuning-jobs").json()["items"]] == [body["id"]]


def test_the_worker_runs_secret_trials_in_its_slots_and_releases_the_best_as_an_ordinary_job(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    draws: list[object] = []

    def spy(distribution: object, *, rng: object) -> int:
        draws.append(rng)
        return 2

    with (
        mock.patch("kernel.privacy.sample_trial_count", side_effect=spy),
        mock.patch("worker.slot_runner.TrainingRequest", wraps=TrainingRequest) as requests,
    ):
        assert run_tuning(settings, database, body["job_id"]) == "succeeded"
    assert len(draws) == 1 and isinstance(draws[0], secrets.SystemRandom)
    assert requests.call_count == 2  # K trials, each a training run, in 2 of the 3 slots
    done = alice.get(f"/v1/tuning-jobs/{body['id']}").json()
    assert done["status"] == "succeeded" and done["best_job_id"] == body["job_id"]
    assert done["schedule"]["slots_done"] == 3
    assert set(done["selected"]) == {"training.learning_rate", "training.steps"}
    assert 0.0 <= done["selected_metric"] <= 1.0
    job = alice.get(f"/v1/jobs/{done['best_job_id']}").json()
    assert job["spec"]["training"]["learning_rate"] == done["selected"]["training.learning_rate"]
    assert alice.get(f"/v1/jobs/{done['best_job_id']}/model").status_code == 200
    report = alice.get(f"/v1/jobs/{done['best_job_id']}/report").json()
    assert report["tuning"]["selected"] == done["selected"]
    assert "not shown" in report["tuning"]["trials"]["count"] and report["tuning"]["trials"]["maximum"] == 3
    assert report["tuning"]["schedule"]["slots"] == 3
    assert "not shown" in report["execution"]["statement"] and "seconds" not in report["execution"]
    assert report["caveats"][0].startswith("This job is a private hyperparameter tuning")
    assert report["epsilon"]["ledger"] == pytest.approx(body["epsilon_ledger"])
    html = alice.get(f"/v1/jobs/{done['best_job_id']}/report", params={"format": "html"})
    assert html.status_code == 200 and 'id="tuning-selected"' in html.text and 'id="tuning-slots"' in html.text
    events = alice.get(f"/v1/jobs/{body['job_id']}/events").json()
    assert [e["kind"] for e in events] == ["queued", "started", "succeeded"]  # nothing counts trials
    kinds = [e.kind for e in _entries(database, dataset_id)]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT"]
    assert verify_ledger(database, dataset_id=dataset_id).ok
    ledger = alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]
    assert [entry["kind"] for entry in ledger] == kinds and all(entry["explanation"] for entry in ledger)


def test_the_client_cannot_choose_the_number_of_trials(alice: TestClient, dataset_id: str, database: Database) -> None:
    before = counts(database)
    for trials in ({"mean": 3, "count": 2}, {"mean": 1}, {"mean": 3, "distribution": "poisson", "eta": 1}):
        response = alice.post("/v1/tuning-jobs", json=_request(dataset_id, **trials))
        assert response.status_code == 422, response.text
    assert counts(database) == before


@pytest.mark.parametrize(
    ("trials", "detail"),
    [
        ({"mean": 3, "maximum": 101}, "above this service's limit of 100"),
        ({"mean": 3, "maximum": 4}, "out of reach with at most 4"),  # the logarithmic tail is long
        ({"mean": 2.5, "distribution": "poisson", "maximum": 3}, "keeps only"),  # below the median
    ],
)
def test_a_maximum_the_service_cannot_honour_is_refused(
    alice: TestClient, dataset_id: str, database: Database, trials: dict[str, Any], detail: str
) -> None:
    before = counts(database)
    response = alice.post("/v1/tuning-jobs", json=_request(dataset_id, **trials))
    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/invalid-tuning-spec" and detail in response.json()["detail"]
    assert counts(database) == before


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r["base"].pop("evaluation"), "tuning-needs-evaluation"),
        (lambda r: r["base"]["training"].pop("time_limit_s"), "tuning-needs-time-limit"),
        (lambda r: r["search_space"].update({"privacy.target_epsilon": [1, 2]}), "invalid-search-space"),
        (lambda r: r["search_space"].update({"dataset_id": ["ds_x"]}), "invalid-search-space"),
        (lambda r: r.update({"selection": {"metric": "mse"}}), "invalid-tuning-spec"),
        (lambda r: r["search_space"].update({"training.batch_size": [100_000]}), "invalid-job-spec"),
    ],
)
def test_a_bad_tuning_is_refused_and_leaves_nothing(
    alice: TestClient, dataset_id: str, database: Database, change: Any, problem: str
) -> None:
    request = _request(dataset_id)
    change(request)
    before = counts(database)
    response = alice.post("/v1/tuning-jobs", json=request)
    assert response.status_code == 422, response.text
    assert response.json()["type"] == f"/problems/{problem}"
    assert counts(database) == before
    assert alice.get("/v1/tuning-jobs").json()["items"] == []


def test_a_trial_that_crashes_commits_the_whole_tuning(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=3),
        mock.patch("worker.slot_runner.SlotRunner._run_trial", side_effect=RuntimeError("boom")),
    ):
        assert run_tuning(settings, database, body["job_id"]) == "failed"
    entries = _entries(database, dataset_id)
    assert [e.kind for e in entries] == ["RESERVE", "TOUCH", "COMMIT"]
    assert entries[-1].curve == entries[0].curve  # the full reservation
    view = alice.get(f"/v1/tuning-jobs/{body['id']}").json()
    assert view["status"] == "failed" and view["error_code"] == "training-failed"
    assert verify_ledger(database, dataset_id=dataset_id).ok


def test_a_poisson_tuning_that_draws_no_trial_releases_nothing_and_commits(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id, distribution="poisson", mean=2, maximum=4)).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=0):
        assert run_tuning(settings, database, body["job_id"]) == "failed"
    view = alice.get(f"/v1/tuning-jobs/{body['id']}").json()
    assert view["error_code"] == "no-trials-drawn" and view["best_job_id"] is None
    assert view["schedule"]["slots_done"] == 4  # its slots ran all the same
    assert [e.kind for e in _entries(database, dataset_id)] == ["RESERVE", "TOUCH", "COMMIT"]


def test_trials_still_training_at_their_time_limit_release_nothing(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """A trial past base.training.time_limit_s is stopped and releases nothing: with every trial
    stopped, the tuning fails at the end of its slots, never earlier (a tuning that failed sooner
    for drawing more trials would tell K)."""
    request = _request(dataset_id)
    request["base"]["training"]["time_limit_s"] = 1.0
    body = alice.post("/v1/tuning-jobs", json=request).json()
    real = job_data.load_data_and_units

    def slow_load(*args: Any, **kwargs: Any) -> Any:
        time.sleep(1.1)  # past the trial's time limit before its first step
        return real(*args, **kwargs)

    started = time.monotonic()
    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=2),
        mock.patch("worker.job_data.load_data_and_units", slow_load),
    ):
        assert run_tuning(settings, database, body["job_id"]) == "failed"
    assert time.monotonic() - started >= 3.0  # one slot: 1 s + the 2 s margin
    view = alice.get(f"/v1/tuning-jobs/{body['id']}").json()
    assert view["error_code"] == "no-trial-finished" and view["best_job_id"] is None, view
    assert [e.kind for e in _entries(database, dataset_id)] == ["RESERVE", "TOUCH", "COMMIT"]


def test_a_cancelled_running_tuning_ends_at_once_and_commits_its_whole_charge(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """The cancel settles the tuning in the API's own transaction: when its slots would notice
    depends on whether they hold trials."""
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=2):
        assert JobRunner(settings, db=database).run(body["job_id"]) == "opened"
    cancelled = alice.post(f"/v1/tuning-jobs/{body['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"  # at once, before any slot ran
    assert cancelled["epsilon_committed"] == pytest.approx(cancelled["epsilon_ledger"])
    assert set(run_slots(settings, database, body["job_id"]).values()) == {"skipped"}
    entries = _entries(database, dataset_id)
    assert [e.kind for e in entries] == ["RESERVE", "TOUCH", "COMMIT"]
    assert entries[-1].curve == entries[0].curve
    assert verify_ledger(database, dataset_id=dataset_id).ok
    events = alice.get(f"/v1/jobs/{body['job_id']}/events").json()
    assert [e["kind"] for e in events] == ["queued", "started", "cancelled"]


def test_the_cli_estimates_creates_shows_and_cancels_a_tuning(
    dataset_id: str,
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key}

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), obj=CliEnvironment(transport=transport), env=env)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    spec = tmp_path / "tuning.json"
    spec.write_text(json.dumps(_request(dataset_id)))
    estimated = run("tuning", "estimate", "--spec", str(spec))
    assert "ε of its trials as separate jobs" in estimated and "3 slots of 5 s" in estimated
    created = json.loads(run("tuning", "create", "--spec", str(spec), "--json"))
    assert created["status"] == "queued"
    shown = run("tuning", "show", created["id"])
    assert "the count is never shown" in shown and "0 of 3 slots done" in shown
    assert json.loads(run("tuning", "list", "--json"))[0]["id"] == created["id"]
    cancelled = json.loads(run("tuning", "cancel", created["id"], "--json"))
    assert cancelled["status"] == "cancelled" and cancelled["epsilon_committed"] in (0.0, None)


def test_a_worker_lost_before_opening_the_tuning_is_retried_inside_the_same_reservation(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """As for a job: the reconciler puts a tuning whose worker stopped beating before it drew K
    back in the queue; the retry draws its trials and commits the one reservation."""
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    first = JobRunner(settings, db=database).claim(body["job_id"])  # the worker that will be lost
    assert first is not None
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert (
        lifecycle.requeue_or_fail(
            database, job_id=body["job_id"], dataset_id=dataset_id, attempt=1, stale_before=later, max_attempts=3
        )
        == "queued"
    )
    with mock.patch("kernel.privacy.sample_trial_count", return_value=2):
        assert run_tuning(settings, database, body["job_id"]) == "succeeded"
    entries = _entries(database, dataset_id)
    assert [e.kind for e in entries] == ["RESERVE", "TOUCH", "COMMIT"]
    assert entries[-1].curve == entries[0].curve
    assert verify_ledger(database, dataset_id=dataset_id).ok


def test_every_trial_draws_the_noise_of_a_charged_candidate(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """Each trial trains with the σ, q and steps of one candidate of the charged tuning event."""
    body = alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    reserve = next(e for e in _entries(database, dataset_id) if e.kind == "RESERVE")
    event = privacy.event_from_json(reserve.event)
    assert isinstance(event, privacy.HyperparameterTuningEvent)
    charged = set()
    for candidate in event.candidates:
        assert isinstance(candidate, privacy.ComposedEvent)
        training = candidate.events[0]
        assert isinstance(training, privacy.PoissonSampledGaussianEvent)
        charged.add((training.noise_multiplier, training.sampling_probability, training.count))
    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=3),
        mock.patch("worker.slot_runner.TrainingRequest", wraps=TrainingRequest) as requests,
    ):
        assert run_tuning(settings, database, body["job_id"]) == "succeeded"
    drawn = {
        (call.kwargs["noise_multiplier"], call.kwargs["sampling_probability"], call.kwargs["steps"])
        for call in requests.call_args_list
    }
    assert requests.call_count == 3 and drawn <= charged
