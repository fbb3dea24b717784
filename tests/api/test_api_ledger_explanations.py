"""GET /v1/datasets/{id}/ledger explains each entry in words; a RELEASE reads as budget given back
(never as a second charge), with how the job ended. The CLI's ``datasets ledger`` prints them."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.ledger import operations as ledger
from kernel.ledger.explanations import EXPLAINERS, explain_entry
from privtrain.cli import CliEnvironment, cli
from privtrain_common.directed_rounding import format_guarantee
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import to_csv, upload
from worker.runner import JobRunner


@pytest.fixture
def small_dataset(alice: TestClient) -> str:
    rng = np.random.default_rng(1)
    X = rng.random((300, 4))
    response = upload(alice, to_csv(X, (X[:, 1] > 0.5).astype(int)), name="small")
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _spec(dataset_id: str) -> dict[str, object]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.5},
        "training": {"steps": 20, "batch_size": 32, "learning_rate": 0.5},
    }


def _entries(client: TestClient, dataset_id: str, job_id: str | None = None) -> list[dict]:
    items = client.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]
    return [e for e in items if job_id is None or e["job_id"] == job_id]


def test_every_entry_kind_has_an_explainer() -> None:
    assert set(EXPLAINERS) == set(ledger.ENTRY_KINDS)
    assert explain_entry(kind="NEW", job_id=None, curve=None, details={}, job=None, dataset_delta=1e-5) == "a NEW entry"


def test_a_job_cancelled_before_it_started_gets_its_whole_reservation_back(
    alice: TestClient, small_dataset: str
) -> None:
    job = alice.post("/v1/jobs", json=_spec(small_dataset)).json()
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    reserve, release = _entries(alice, small_dataset, job["id"])
    assert reserve["explanation"] == (
        f"reserved ε {format_guarantee(job['epsilon_ledger'])} (at δ 1e-05) for job {job['id']} before it "
        "ran: its worst case, held against the budget until the job ends"
    )
    assert release["kind"] == "RELEASE"
    assert release["explanation"] == (
        f"the whole of job {job['id']}'s reservation was returned to the budget (the job ended before "
        "any worker opened the data: cancelled before start); the job spent nothing"
    )


def test_a_job_cancelled_while_running_commits_what_ran_and_returns_the_rest(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    job = alice.post("/v1/jobs", json=_spec(small_dataset)).json()
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None and runner.settle_stopped(claimed, steps_run=3) == "cancelled"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    kinds = [(e["kind"], e["explanation"]) for e in _entries(alice, small_dataset, job["id"])]
    assert [k for k, _ in kinds] == ["RESERVE", "TOUCH", "COMMIT", "RELEASE"]
    assert kinds[1][1].startswith(f"a worker opened the data for job {job['id']} (attempt 1)")
    assert kinds[2][1] == (
        f"job {job['id']} ran 3 of 20 steps and committed ε {format_guarantee(final['epsilon'])} "
        "(at δ 1e-05) (cancelled)"
    )
    assert kinds[3][1] == (
        f"the unused part of job {job['id']}'s reservation was returned to the budget (the job was "
        "cancelled after 3 of 20 steps; it was charged only what its COMMIT says)"
    )
    assert format_guarantee(final["epsilon_ledger"]) not in kinds[3][1]


def test_a_raised_budget_is_explained_with_its_reason(alice: TestClient, small_dataset: str) -> None:
    assert (
        alice.post(f"/v1/datasets/{small_dataset}/budget", json={"epsilon": 9.0, "reason": "year 2"}).status_code == 200
    )
    (adjust,) = _entries(alice, small_dataset)
    assert adjust["kind"] == "ADJUST"
    assert adjust["explanation"] == "the owner raised the budget from ε 8, δ 1e-05 to ε 9, δ 1e-05: year 2"


def test_the_cli_ledger_prints_the_explanations(alice: TestClient, small_dataset: str) -> None:
    job = alice.post("/v1/jobs", json=_spec(small_dataset)).json()
    alice.post(f"/v1/jobs/{job['id']}/cancel")
    key = alice.headers["Authorization"].removeprefix("Bearer ")
    result = CliRunner().invoke(
        cli,
        ["datasets", "ledger", small_dataset],
        obj=CliEnvironment(transport=AppTransport(alice)),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr)
    table, said = result.stdout.split("\n\nwhat happened\n")
    assert table.splitlines()[0].split()[:2] == ["SEQ", "KIND"]
    lines = said.splitlines()
    assert lines[0].startswith(f"#1  reserved ε {format_guarantee(job['epsilon_ledger'])}")
    assert lines[1].startswith(f"#2  the whole of job {job['id']}'s reservation was returned to the budget")


def test_explanations_state_epsilon_at_the_jobs_delta() -> None:
    """ε in words is the job's own (its δ), the figure its views show; rounded up."""
    curve = [0.1] * len(ledger.zero_curve())
    job = Job(id="job_x", delta=1e-6, steps_run=5, steps_planned=10, status="succeeded")
    said = explain_entry(
        kind="COMMIT",
        job_id="job_x",
        curve=curve,
        details={"steps_run": 5, "reason": "succeeded"},
        job=job,
        dataset_delta=1e-5,
    )
    assert said == (
        f"job job_x ran 5 of 10 steps and committed ε {format_guarantee(ledger.curve_epsilon(curve, 1e-6))} "
        "(at δ 1e-06) (succeeded)"
    )
    released = explain_entry(
        kind="RELEASE",
        job_id="job_x",
        curve=curve,
        details={"reason": "unused part of the reservation"},
        job=job,
        dataset_delta=1e-5,
    )
    assert "(the job stopped after 5 of 10 steps;" in released
