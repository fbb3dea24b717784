"""A job states one ε: what it committed once it ended, what it reserved while it runs. Checked in
GET /v1/jobs/{id}, the jobs list, the CLI's ``jobs list``/``jobs show``, the JSON and HTML report
(before / this job's charge / after, golden numbers with another job committing in between), and
the migration that backfills the column for jobs that ended before it existed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from alembic import command
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from api.job_views import JobEpsilon, job_epsilon
from kernel import privacy
from kernel.bootstrap import alembic_config
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry
from kernel.ledger import operations as ledger
from privtrain.cli import CliEnvironment, cli
from privtrain_common.directed_rounding import format_guarantee, format_remaining
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import to_csv, upload
from tests.ui.html_probe import parse, text_of
from worker.runner import JobRunner

N_ROWS = 300


@pytest.fixture
def small_dataset(alice: TestClient) -> str:
    """300 rows, 4 features, two classes; ε_G = 8, δ_G = 1e-5."""
    rng = np.random.default_rng(0)
    X = rng.random((N_ROWS, 4))
    y = (X[:, 0] > 0.5).astype(int)
    response = upload(alice, to_csv(X, y), name="small")
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _spec(dataset_id: str, *, sigma: float, steps: int) -> dict[str, object]:
    """A fixed σ, so every event (and every golden number below) is fixed by the spec alone."""
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": sigma},
        "training": {"steps": steps, "batch_size": 32, "learning_rate": 0.5},
    }


def _submit(client: TestClient, spec: dict[str, object]) -> dict:
    response = client.post("/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    return response.json()


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


def _list_row(result: Result, job_id: str) -> dict[str, str]:
    header, *rows = result.stdout.splitlines()
    (row,) = [r for r in rows if r.startswith(job_id)]
    return dict(zip(header.split(), row.split(), strict=False))


def _commit_curve(database: Database, job_id: str) -> tuple[float, ...]:
    with database.read_session() as session:
        curve = session.scalar(
            select(LedgerEntry.curve).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == ledger.COMMIT)
        )
    assert curve is not None
    return tuple(curve)


# ---------------------------------------------------------------------- the pure helper


def test_job_epsilon_is_committed_once_ended_and_reserved_while_running() -> None:
    for status in ("queued", "running"):
        job = Job(status=status, epsilon_ledger=1.5, epsilon_committed=None)
        assert job_epsilon(job) == JobEpsilon(value=1.5, basis="reserved")
    for status in ("succeeded", "failed", "cancelled"):
        job = Job(status=status, epsilon_ledger=1.5, epsilon_committed=1.167)
        assert job_epsilon(job) == JobEpsilon(value=1.167, basis="committed")
    assert job_epsilon(Job(status="cancelled", epsilon_ledger=1.5, epsilon_committed=0.0)).value == 0.0
    # a finished row nobody could backfill keeps saying what it is: a reservation
    assert job_epsilon(Job(status="failed", epsilon_ledger=1.5, epsilon_committed=None)).basis == "reserved"


# ---------------------------------------------------------------------- golden report


def test_report_shows_before_charge_and_after_when_another_job_commits_in_between(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """A is admitted, then B; B runs and commits; then A runs. A's "before" is the ledger just
    before A's COMMIT without A: B's commit is in it (it is not A's spending), A's own reservation
    is not (the bug: remaining ε read the same before and after)."""
    a = _submit(alice, _spec(small_dataset, sigma=1.5, steps=20))
    b = _submit(alice, _spec(small_dataset, sigma=2.0, steps=10))
    runner = JobRunner(settings, db=database)
    assert runner.run(b["id"]) == "succeeded"
    assert runner.run(a["id"]) == "succeeded"
    report = alice.get(f"/v1/jobs/{a['id']}/report").json()
    before, charge, after = report["ledger"]["before"], report["ledger"]["charge"], report["ledger"]["after"]

    # recomputed independently from the hashed COMMIT curves, summed as the ledger sums them
    # (outward-rounded additions from zero)
    curve_a, curve_b = _commit_curve(database, a["id"]), _commit_curve(database, b["id"])
    only_b = privacy.add_curves(tuple(ledger.zero_curve()), curve_b)
    both = privacy.add_curves(only_b, curve_a)
    capacity, nothing_reserved = ledger.capacity(8.0, 1e-5), tuple(ledger.zero_curve())

    def remaining(committed: tuple[float, ...]) -> float:
        used = privacy.add_curves(committed, nothing_reserved)
        return privacy.remaining_epsilon(used=used, capacity=capacity, delta=1e-5)

    assert before["committed_epsilon"] == ledger.curve_epsilon(only_b, 1e-5)
    assert before["reserved_epsilon"] == 0.0 == after["reserved_epsilon"]
    assert before["remaining_epsilon"] == remaining(only_b)
    assert after["committed_epsilon"] == ledger.curve_epsilon(both, 1e-5)
    assert after["remaining_epsilon"] == remaining(both)
    assert charge["epsilon_committed"] == ledger.curve_epsilon(curve_a, 1e-5) == report["epsilon"]["ledger"]
    assert charge["rdp_curve"]["values"] == list(curve_a) == report["rdp_curve"]["values"]
    assert before["entries"] == report["ledger"]["commit_entry_seq"] - 1
    assert f"entry #{before['entries']}" in report["ledger"]["before_definition"]

    # golden: the numbers as printed (guarantees rounded up, what remains rounded down)
    assert format_remaining(before["remaining_epsilon"]) == GOLDEN["before_remaining"]
    assert format_guarantee(before["committed_epsilon"]) == GOLDEN["before_committed"]
    assert format_guarantee(charge["epsilon_committed"]) == GOLDEN["charge"]
    assert format_guarantee(after["committed_epsilon"]) == GOLDEN["after_committed"]
    assert format_remaining(after["remaining_epsilon"]) == GOLDEN["after_remaining"]
    assert report["guarantee"] == (
        f"({GOLDEN['charge']}, 1e-05)-differential privacy for one row: the ε this job committed to the "
        "dataset's ledger"
    )

    # B's own report: A's reservation was open when B committed, so it sits in both columns
    report_b = alice.get(f"/v1/jobs/{b['id']}/report").json()["ledger"]
    assert report_b["before"]["reserved_epsilon"] == report_b["after"]["reserved_epsilon"] > 0
    assert report_b["before"]["committed_epsilon"] == 0.0

    # the HTML report shows the same three columns
    page = parse(alice.get(f"/v1/jobs/{a['id']}/report", params={"format": "html"}).text)
    (shown_charge,) = page.with_attr("data-field", "charge.committed_epsilon")
    assert float(shown_charge.attrs["data-value"]) == charge["epsilon_committed"]
    assert text_of(shown_charge) == format_guarantee(charge["epsilon_committed"], digits=6)
    (shown_before,) = page.with_attr("data-field", "before.remaining_epsilon")
    assert text_of(shown_before) == format_remaining(before["remaining_epsilon"], digits=6)
    assert "without this job" in text_of(page.by_id("budget-before-definition"))


GOLDEN = {  # ε_G = 8, δ = 1e-5; B: σ = 2, 10 steps; A: σ = 1.5, 20 steps; q = 32/300
    "before_committed": "1.278",  # B alone
    "before_remaining": "7.911",
    "charge": "2.532",  # A
    "after_committed": "2.69",  # B and A composed (RDP curves add, ε values do not)
    "after_remaining": "7.52",
}


# ---------------------------------------------------------------------- ended jobs state what they spent


def test_a_job_cancelled_before_it_started_states_zero(alice: TestClient, small_dataset: str) -> None:
    job = _submit(alice, _spec(small_dataset, sigma=1.5, steps=20))
    assert job["epsilon_basis"] == "reserved" and job["epsilon"] == job["epsilon_ledger"] > 0
    cancelled = alice.post(f"/v1/jobs/{job['id']}/cancel").json()
    assert (cancelled["epsilon"], cancelled["epsilon_basis"], cancelled["epsilon_committed"]) == (0.0, "committed", 0.0)
    assert cancelled["epsilon_ledger"] == job["epsilon_ledger"]  # still documented: the reservation it held
    (listed,) = [j for j in alice.get("/v1/jobs").json()["items"] if j["id"] == job["id"]]
    assert listed["epsilon"] == 0.0 and listed["epsilon_basis"] == "committed"
    shown = _block(_cli(alice, "jobs", "show", job["id"]))
    assert shown["ε committed at δ=1e-05"] == "0"
    assert format_guarantee(job["epsilon_ledger"]) not in _cli(alice, "jobs", "show", job["id"]).stdout


def test_a_job_cancelled_while_running_states_what_it_committed(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """The worker noticed the cancel after 3 of 20 steps: it commits 3 steps and releases the rest."""
    job = _submit(alice, _spec(small_dataset, sigma=1.5, steps=20))
    runner = JobRunner(settings, db=database)
    claimed = runner.claim(job["id"])
    assert claimed is not None
    assert runner.settle_stopped(claimed, steps_run=3) == "cancelled"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    three_steps = ledger.curve_epsilon(_commit_curve(database, job["id"]), final["delta"])
    assert final["status"] == "cancelled" and final["epsilon_basis"] == "committed"
    assert final["epsilon"] == final["epsilon_committed"] == three_steps < final["epsilon_ledger"]
    _assert_cli_states_committed(alice, final)


def test_a_run_that_stopped_early_states_its_committed_epsilon_everywhere(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """adaptive-noisy-gd capped at 3 iterations spends a few of its 1000 budget units; the report's
    headline, the job, the list and the CLI all say what it committed, never the reservation."""
    spec = {
        "dataset_id": small_dataset,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "adaptive-noisy-gd", "hyperparameters": {"L0": 3.0, "L1": 2.0}},
        "privacy": {"target_epsilon": 1.5},
        "training": {"steps": 3},
    }
    job = _submit(alice, spec)
    assert JobRunner(settings, db=database).run(job["id"]) == "succeeded"
    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert 0 < final["steps_run"] < final["steps_planned"]
    assert final["epsilon_basis"] == "committed"
    assert final["epsilon"] == final["epsilon_committed"] < final["epsilon_ledger"]
    report = alice.get(f"/v1/jobs/{job['id']}/report").json()
    committed, reserved = format_guarantee(final["epsilon"]), format_guarantee(final["epsilon_ledger"])
    assert report["epsilon"]["ledger"] == final["epsilon"] and report["epsilon"]["reserved"] == final["epsilon_ledger"]
    assert report["guarantee"].startswith(f"({committed}, 1e-05)-differential privacy for one row")
    assert report["guarantee"].endswith(
        f"It ran {final['steps_run']} of {final['steps_planned']} budget units; committed ε {committed} "
        f"(it had reserved ε {reserved}), the rest of the reservation was released"
    )
    assert report["ledger"]["charge"]["rest_of_reservation_released"] is True
    page = parse(alice.get(f"/v1/jobs/{job['id']}/report", params={"format": "html"}).text)
    assert text_of(page.by_id("epsilon-ledger")) == format_guarantee(final["epsilon"], digits=6)
    assert text_of(page.by_id("guarantee")) == report["guarantee"]
    assert reserved not in text_of(page.by_id("guarantee")).split("(it had reserved")[0]
    _assert_cli_states_committed(alice, final)


def _assert_cli_states_committed(client: TestClient, final: dict) -> None:
    committed, reserved = format_guarantee(final["epsilon"]), format_guarantee(final["epsilon_ledger"])
    assert committed != reserved
    show = _cli(client, "jobs", "show", final["id"])
    assert _block(show)["ε committed at δ=1e-05"] == committed
    assert reserved not in show.stdout
    row = _list_row(_cli(client, "jobs", "list"), final["id"])
    assert (row["ε"], row["BASIS"]) == (committed, "committed")


def test_a_queued_job_states_its_reservation(alice: TestClient, small_dataset: str) -> None:
    job = _submit(alice, _spec(small_dataset, sigma=1.5, steps=20))
    row = _list_row(_cli(alice, "jobs", "list"), job["id"])
    assert (row["ε"], row["BASIS"]) == (format_guarantee(job["epsilon_ledger"]), "reserved")
    assert _block(_cli(alice, "jobs", "show", job["id"]))["ε reserved at δ=1e-05"] == format_guarantee(
        job["epsilon_ledger"]
    )
    assert job["epsilon_committed"] is None


# ---------------------------------------------------------------------- migration 0008


def test_migration_0008_backfills_what_commit_records(
    alice: TestClient, settings: Settings, database: Database, small_dataset: str
) -> None:
    """Downgrade to 0007 drops the column; upgrading again fills it for ended jobs from their
    COMMIT curve at the job's δ (0 for a job released whole), exactly as ledger.commit does."""
    ran = _submit(alice, _spec(small_dataset, sigma=2.0, steps=10))
    assert JobRunner(settings, db=database).run(ran["id"]) == "succeeded"
    released = _submit(alice, _spec(small_dataset, sigma=2.0, steps=10))
    alice.post(f"/v1/jobs/{released['id']}/cancel")
    queued = _submit(alice, _spec(small_dataset, sigma=2.0, steps=10))
    with database.read_session() as session:
        recorded = {j.id: j.epsilon_committed for j in session.scalars(select(Job))}
    assert recorded[ran["id"]] > 0 and recorded[released["id"]] == 0.0 and recorded[queued["id"]] is None
    database.dispose()

    config = alembic_config(settings.resolved_database_url)
    command.downgrade(config, "0007")
    command.upgrade(config, "head")
    with database.read_session() as session:
        assert {j.id: j.epsilon_committed for j in session.scalars(select(Job))} == recorded
        # and readers fall back to the reservation where nothing could be backfilled
        with database.write_transaction() as tx:
            tx.execute(update(Job).where(Job.id == ran["id"]).values(epsilon_committed=None))
    shown = alice.get(f"/v1/jobs/{ran['id']}").json()
    assert shown["epsilon_basis"] == "reserved" and shown["epsilon"] == shown["epsilon_ledger"]


def test_migration_module_is_at_0008() -> None:
    text = (Path(__file__).resolve().parents[2] / "migrations/versions/0008_job_committed_epsilon.py").read_text()
    assert 'revision = "0008"' in text and 'down_revision = "0007"' in text
