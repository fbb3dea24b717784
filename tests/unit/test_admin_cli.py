"""The admin CLI: keys, ledger verification (with tampering), reconciliation."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from admin.cli import main
from kernel.config import Settings, get_settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, LedgerEntry
from tests.conftest import dp_sgd_spec, upload


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("PRIVTRAIN_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("PRIVTRAIN_ENVIRONMENT", "test")
    get_settings.cache_clear()
    yield settings
    get_settings.cache_clear()


def test_create_key_prints_a_working_key(
    cli_env: Settings, app_client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["create-key", "--tenant", "carol", "--label", "laptop"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("pt_")
    assert app_client.get("/v1/datasets", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_verify_ledger_detects_one_tampered_row(
    cli_env: Settings, alice: TestClient, digits_csv: bytes, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset_id = upload(alice, digits_csv).json()["id"]
    for _ in range(2):
        assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=2.0)).status_code == 202
    assert main(["verify-ledger"]) == 0
    assert "ledger audit OK" in capsys.readouterr().out
    with database.write_transaction() as tx:  # make the first reservation look cheaper
        tx.execute(update(LedgerEntry).where(LedgerEntry.seq == 1).values(curve=[0.0] * 20))
    assert main(["verify-ledger", "--dataset", dataset_id]) == 1
    out = capsys.readouterr().out
    assert "hash-mismatch" in out and "FAILED" in out


def test_reconcile_once_resends_lost_queued_jobs(
    cli_env: Settings,
    alice: TestClient,
    digits_csv: bytes,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:

    dataset_id = upload(alice, digits_csv).json()["id"]
    alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id))
    monkeypatch.setenv("PRIVTRAIN_REDISPATCH_AFTER_S", "0.000001")
    get_settings.cache_clear()
    sent: list[tuple[str, str | None]] = []
    monkeypatch.setattr(
        "kernel.services.CeleryDispatcher.dispatch",
        lambda self, job_id, *, queue=None: sent.append((job_id, queue)),
    )
    assert main(["reconcile"]) == 0
    assert "re-sent 1" in capsys.readouterr().out and len(sent) == 1
    assert sent[0][1] == "cpu"  # re-sent to the job's own queue (a logistic regression: the CPU queue)


def test_content_digests_backfills_datasets_registered_before_digests(
    cli_env: Settings, alice: TestClient, digits_csv: bytes, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rows registered before content digests (migration 0016 leaves the column NULL) are
    recognised by their bytes only, so two were registered from the same rows (LF and CRLF);
    the command fills the digest, names the pair, and from then on the CRLF bytes are refused."""
    first = upload(alice, digits_csv).json()["id"]
    with database.write_transaction() as tx:  # as migrated: no digest
        tx.execute(update(Dataset).values(content_digest=None))
    crlf = digits_csv.replace(b"\n", b"\r\n")
    second = upload(alice, crlf)
    assert second.status_code == 201  # what happened before digests existed
    with database.write_transaction() as tx:
        tx.execute(update(Dataset).values(content_digest=None))
    assert main(["content-digests"]) == 0
    out = capsys.readouterr().out
    assert "content digests computed for 2 dataset(s)" in out
    assert f"same rows, one tenant, separate budgets (registered before content digests): {first}, " in out
    assert upload(alice, crlf + b"\r\n", name="third").status_code == 409
