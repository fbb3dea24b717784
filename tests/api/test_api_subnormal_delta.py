"""A δ stored before δ ≥ 1e-30 was enforced (5e-324, a subnormal) must never take a page down.

Security review item: δ/20 underflowed to 0 and log(0) failed, so /metrics, verify-ledger and the
owner's budget, ledger and dashboard pages answered 500 for good. The rows are written straight
into the database, as an old deployment holds them; everything must answer with finite,
conservative numbers (a smaller δ never gives a smaller ε).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import select

from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry, PrivacyBudget
from kernel.ledger import operations as ledger
from kernel.ledger.audit import verify_ledger
from tests.conftest import dp_sgd_spec, upload
from tests.ui.conftest import csrf_token_of
from worker.runner import JobRunner

SUBNORMAL = 5e-324
METRICS_TOKEN = "m" * 40
REPO_ROOT = Path(__file__).resolve().parents[2]


def _make_delta_subnormal(database: Database, dataset_id: str) -> None:
    """What an old deployment holds: the budget opened at δ = 5e-324, its genesis hash to match."""
    with database.write_transaction() as tx:
        budget = tx.get(PrivacyBudget, dataset_id)
        assert budget is not None and budget.entry_count == 0
        budget.delta = SUBNORMAL
        budget.last_hash = ledger.genesis_hash(
            dataset_id, epsilon=budget.epsilon, delta=SUBNORMAL, orders_version=budget.orders_version
        )


@pytest.fixture
def old_dataset(alice: TestClient, settings: Settings, database: Database, digits_csv: bytes) -> str:
    """Alice's dataset at δ = 5e-324 with a finished job, a queued one and a raised budget."""
    dataset_id = upload(alice, digits_csv).json()["id"]
    _make_delta_subnormal(database, dataset_id)
    spec = dp_sgd_spec(dataset_id, target_epsilon=6.0)  # δ defaults to the dataset's: 5e-324
    spec["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    done = alice.post("/v1/jobs", json=spec)
    assert done.status_code == 202, done.text
    assert JobRunner(settings, db=database).run(done.json()["id"]) == "succeeded"
    spec["privacy"] = {"target_epsilon": 3.0}
    assert alice.post("/v1/jobs", json=spec).status_code == 202
    raised = alice.post(f"/v1/datasets/{dataset_id}/budget", json={"epsilon": 12.0, "reason": "more"})
    assert raised.status_code == 200, raised.text
    with database.read_session() as session:
        assert {job.delta for job in session.scalars(select(Job))} == {SUBNORMAL}
        kinds = [e.kind for e in session.scalars(select(LedgerEntry).order_by(LedgerEntry.seq))]
    assert kinds == ["RESERVE", "TOUCH", "COMMIT", "RESERVE", "ADJUST"]
    return dataset_id


def test_budget_and_ledger_answer_with_conservative_numbers(alice: TestClient, old_dataset: str) -> None:
    budget = alice.get(f"/v1/datasets/{old_dataset}/budget")
    assert budget.status_code == 200, budget.text
    view = budget.json()
    assert view["delta"] == SUBNORMAL
    committed = view["committed_epsilon"]
    for name in ("committed_epsilon", "reserved_epsilon", "spent_epsilon", "remaining_epsilon"):
        assert math.isfinite(view[name]) and view[name] >= 0
    # conservative: the same spending costs more ε at δ = 5e-324 than at the smallest new δ
    assert committed > ledger.curve_epsilon([row["committed"] for row in view["per_order"]], 1e-30) > 0
    assert 0 < view["remaining_epsilon"] < 12.0
    page = alice.get(f"/v1/datasets/{old_dataset}/ledger")
    assert page.status_code == 200, page.text
    epsilons = [item["epsilon"] for item in page.json()["items"] if item["curve"]]
    assert len(epsilons) == 3 and all(math.isfinite(e) and e > 0 for e in epsilons)
    assert alice.get(f"/v1/datasets/{old_dataset}").status_code == 200


def test_metrics_export_the_ledger_of_a_subnormal_delta(
    alice: TestClient, settings: Settings, old_dataset: str
) -> None:
    settings.metrics_token = SecretStr(METRICS_TOKEN)
    response = alice.get("/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200, response.text
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.labels.get("dataset_id") == old_dataset
    }
    budget = alice.get(f"/v1/datasets/{old_dataset}/budget").json()
    assert samples["privtrain_epsilon_committed"] == pytest.approx(budget["committed_epsilon"])
    assert samples["privtrain_epsilon_reserved"] == pytest.approx(budget["reserved_epsilon"])


def test_verify_ledger_passes_in_a_real_process(settings: Settings, database: Database, old_dataset: str) -> None:
    assert verify_ledger(database).ok
    env = {**os.environ, "PRIVTRAIN_DATA_DIR": str(settings.data_dir), "PRIVTRAIN_ENVIRONMENT": "test"}
    env.pop("PRIVTRAIN_DATABASE_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "admin.cli", "verify-ledger", "--dataset", old_dataset],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ledger audit OK" in result.stdout


def test_dashboard_pages_render(app_client: TestClient, alice: TestClient, old_dataset: str) -> None:
    key = alice.headers.pop("Authorization").removeprefix("Bearer ")
    token = csrf_token_of(app_client.get("/ui/login").text)
    login = app_client.post("/ui/login", data={"csrf_token": token, "api_key": key}, follow_redirects=False)
    assert login.status_code == 303, login.text
    for path in ("/ui/datasets", f"/ui/datasets/{old_dataset}"):
        page = app_client.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert old_dataset in page.text


def test_the_job_report_states_a_finite_epsilon_at_the_jobs_delta(
    alice: TestClient, database: Database, old_dataset: str
) -> None:
    with database.read_session() as session:
        job = session.scalars(select(Job).where(Job.status == "succeeded")).one()
    report = alice.get(f"/v1/jobs/{job.id}/report")
    assert report.status_code == 200, report.text
    assert alice.get(f"/v1/jobs/{job.id}/report", params={"format": "html"}).status_code == 200
    body = alice.get(f"/v1/jobs/{job.id}").json()
    assert body["status"] == "succeeded"
    curve = privacy.rdp_curve(privacy.event_from_json(job.event))
    assert privacy.ledger_epsilon(curve, SUBNORMAL) > privacy.ledger_epsilon(curve, 1e-30)
