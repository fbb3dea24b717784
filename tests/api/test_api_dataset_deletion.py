"""Data owners delete and correct (issue 35, item 6): ``DELETE /v1/datasets/{id}`` stops the
dataset's jobs with the ε they spent committed, erases its rows from the store (the upload, its
decoded arrays, its jobs' private files and, at the owner's choice, their models), keeps a
tombstone whose hash-chained ledger still verifies, and the same rows uploaded again, however
they are written down, continue that ledger. The filesystem store here; the object store's
copies in tests/api/test_api_object_store.py."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, ErasedBlob, Job, JobEvent, LedgerEntry
from kernel.ledger.audit import verify_ledger
from kernel.reconciler import reconcile_once
from kernel.storage.blobs import BlobStore, StorageUnavailable
from tests.api.worker_jobs import upload_shapes
from tests.conftest import RecordingDispatcher, dp_sgd_spec, new_key, to_csv
from tests.text_fixtures import classification_body
from tests.tuning_run import TRIAL_TIME_LIMIT_S, run_slots
from worker import job_data
from worker.runner import JobRunner

QUERY = {"name": "rows", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}


def rows_csv(seed: int = 0, n: int = 300) -> bytes:
    rng = np.random.default_rng(seed)
    return to_csv(rng.random((n, 4)), rng.integers(0, 2, n))


def small_spec(dataset_id: str, *, steps: int = 4) -> dict[str, Any]:
    spec = dp_sgd_spec(dataset_id, target_epsilon=1.0)
    spec["training"] = {"steps": steps, "batch_size": 64, "learning_rate": 0.5}
    return spec


def upload(client: TestClient, body: bytes, headers: dict[str, str] | None = None, **params: object) -> Any:
    return client.post("/v1/datasets", params={**QUERY, **params}, content=body, headers=headers or {})


def register(client: TestClient, body: bytes, **params: object) -> str:
    response = upload(client, body, **params)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def stored(settings: Settings, key: str | None) -> bool:
    assert key is not None
    return (settings.blob_dir / key).is_file()


def row_of(database: Database, dataset_id: str) -> Dataset:
    with database.read_session() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        return dataset


def job_row(database: Database, job_id: str) -> Job:
    with database.read_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def ledger_kinds(database: Database, dataset_id: str) -> list[str]:
    with database.read_session() as session:
        return list(
            session.scalars(
                select(LedgerEntry.kind).where(LedgerEntry.dataset_id == dataset_id).order_by(LedgerEntry.seq)
            )
        )


def run_job(alice: TestClient, settings: Settings, database: Database, dataset_id: str) -> str:
    submitted = alice.post("/v1/jobs", json=small_spec(dataset_id))
    assert submitted.status_code == 202, submitted.text
    assert JobRunner(settings, db=database).run(submitted.json()["id"]) == "succeeded"
    return str(submitted.json()["id"])


def share(alice: TestClient, dataset_id: str, bob_headers: dict[str, str]) -> None:
    assert alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"}).status_code == 202
    assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob_headers).status_code == 200


# --------------------------------------------------------------------------- who may delete


def test_only_the_owner_may_delete(alice: TestClient, bob_headers: dict[str, str], database: Database) -> None:
    dataset_id = register(alice, rows_csv())
    share(alice, dataset_id, bob_headers)
    carol = {"Authorization": f"Bearer {new_key(database, 'carol')}"}
    analyst = alice.delete(f"/v1/datasets/{dataset_id}", headers=bob_headers)
    assert analyst.status_code == 403 and analyst.json()["type"] == "/problems/forbidden"
    stranger = alice.delete(f"/v1/datasets/{dataset_id}", headers=carol)
    assert stranger.status_code == 404 and stranger.json()["type"] == "/problems/not-found"
    assert alice.get(f"/v1/datasets/{dataset_id}").json()["status"] == "active"
    assert alice.delete("/v1/datasets/ds_000000000000000000000000").status_code == 404


# --------------------------------------------------------------------------- the erasure


def test_owner_deletes_and_the_rows_are_erased_while_the_ledger_stays(
    alice: TestClient, bob_headers: dict[str, str], settings: Settings, database: Database
) -> None:
    dataset_id = register(alice, rows_csv())
    share(alice, dataset_id, bob_headers)
    bobs = alice.post("/v1/jobs", json=small_spec(dataset_id), headers=bob_headers).json()["id"]
    assert JobRunner(settings, db=database).run(bobs) == "succeeded"
    # What a lost attempt would have left on worker storage: a checkpoint, a hold-out split, a killed write.
    leftovers = [settings.checkpoint_dir / f"{bobs}{suffix}" for suffix in (".safetensors", ".holdout.npy")]
    leftovers.append(settings.checkpoint_dir / f".{bobs}.safetensors.1234.tmp")
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"secret state")
    before = row_of(database, dataset_id)
    budget_before = alice.get(f"/v1/datasets/{dataset_id}/budget").json()

    deleted = alice.delete(f"/v1/datasets/{dataset_id}")

    assert deleted.status_code == 200, deleted.text
    body = deleted.json()
    assert body["status"] == "deleted" and body["deletion"]["models"] == "kept"
    assert body["deletion"]["deleted_at"] is not None and body["deletion"]["jobs_settling"] == 0
    assert not stored(settings, before.blob_key)
    assert not any(path.exists() for path in leftovers)
    with database.read_session() as session:
        assert session.get(ErasedBlob, before.blob_key) is not None
    # the tombstone: public facts, budget and ledger, for the owner only
    tombstone = alice.get(f"/v1/datasets/{dataset_id}").json()
    assert tombstone["status"] == "deleted" and tombstone["n_rows"] == 300 and tombstone["name"] == "rows"
    assert tombstone["content_digest"] == before.content_digest is not None
    assert (
        alice.get(f"/v1/datasets/{dataset_id}/budget").json()["committed_epsilon"] == budget_before["committed_epsilon"]
    )
    assert [e["kind"] for e in alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]] == ledger_kinds(
        database, dataset_id
    )
    report = verify_ledger(database)
    assert report.ok, report.problems
    # the analyst lost the dataset, not its own job, its model or its report
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob_headers).status_code == 404
    assert alice.get(f"/v1/jobs/{bobs}/model", headers=bob_headers).status_code == 200
    assert alice.get(f"/v1/jobs/{bobs}/report", headers=bob_headers).status_code == 200
    grants = alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"]
    assert [g["status"] for g in grants] == ["revoked"]
    # listed only on request
    assert dataset_id not in {d["id"] for d in alice.get("/v1/datasets").json()["items"]}
    listed = alice.get("/v1/datasets", params={"include_deleted": "true"}).json()["items"]
    assert {d["id"]: d["status"] for d in listed}[dataset_id] == "deleted"
    # nothing new on a tombstone
    for refused in (
        alice.post("/v1/jobs", json=small_spec(dataset_id)),
        alice.post("/v1/jobs/estimate", json=small_spec(dataset_id)),
        alice.post(f"/v1/datasets/{dataset_id}/budget", json={"epsilon": 9.0}),
        alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"}),
    ):
        assert refused.status_code == 409 and refused.json()["type"] == "/problems/dataset-deleted", refused.text
        assert refused.json()["status"] == 409 and refused.json()["dataset_status"] == "deleted"


def test_delete_is_idempotent_and_may_turn_keep_into_delete(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = register(alice, rows_csv())
    job_id = run_job(alice, settings, database, dataset_id)
    model_key = job_row(database, job_id).model_blob
    first = alice.delete(f"/v1/datasets/{dataset_id}")
    again = alice.delete(f"/v1/datasets/{dataset_id}")
    assert first.status_code == again.status_code == 200
    assert again.json()["deletion"]["deleted_at"] == first.json()["deletion"]["deleted_at"]
    assert stored(settings, model_key)
    assert alice.delete(f"/v1/datasets/{dataset_id}", params={"models": "delete"}).json()["deletion"]["models"] == (
        "deleted"
    )
    assert not stored(settings, model_key)
    assert alice.delete(f"/v1/datasets/{dataset_id}").json()["deletion"]["models"] == "deleted"  # never undone
    assert alice.delete(f"/v1/datasets/{dataset_id}", params={"models": "drop"}).status_code == 422
    assert verify_ledger(database).ok


def test_models_are_deleted_at_the_owners_choice_and_their_reports_stay(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = register(alice, rows_csv())
    job_id = run_job(alice, settings, database, dataset_id)
    model_key = job_row(database, job_id).model_blob
    assert alice.delete(f"/v1/datasets/{dataset_id}", params={"models": "delete"}).status_code == 200
    assert not stored(settings, model_key)
    gone = alice.get(f"/v1/jobs/{job_id}/model")
    assert gone.status_code == 410 and gone.json()["type"] == "/problems/model-deleted"
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and "model" not in job["links"] and "report" in job["links"]
    report = alice.get(f"/v1/jobs/{job_id}/report")
    assert report.status_code == 200 and report.json()["model"]["sha256"] == job_row(database, job_id).model_sha256
    # its model can no longer be a job's starting point
    other = register(alice, rows_csv(seed=1))
    spec = small_spec(other)
    spec["model"]["init"] = {"job_id": job_id}
    refused = alice.post("/v1/jobs/estimate", json=spec)
    assert refused.status_code == 422 and "deleted" in refused.json()["detail"]


# --------------------------------------------------------------------------- active jobs


def test_queued_jobs_end_released_or_committed_after_a_lost_attempt(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    from kernel.db.orm import utcnow
    from kernel.ledger import operations as ledger

    dataset_id = register(alice, rows_csv())
    fresh = alice.post("/v1/jobs", json=small_spec(dataset_id)).json()
    requeued = alice.post("/v1/jobs", json=small_spec(dataset_id)).json()
    with database.write_transaction() as tx:  # what a claim + a lost worker + the reconciler leave behind
        budget = ledger.lock_budget(tx, dataset_id)
        row = tx.get(Job, requeued["id"])
        assert row is not None
        ledger.touch(tx, budget, job=row, actor="worker:test")
        row.touched_at, row.attempt = utcnow(), 1

    assert alice.delete(f"/v1/datasets/{dataset_id}").status_code == 200

    views = {job["id"]: alice.get(f"/v1/jobs/{job['id']}").json() for job in (fresh, requeued)}
    assert {view["status"] for view in views.values()} == {"cancelled"}
    assert views[fresh["id"]]["epsilon_committed"] == 0.0  # never opened the data: all released
    assert views[requeued["id"]]["epsilon_committed"] == pytest.approx(requeued["epsilon_ledger"], rel=1e-6)
    assert ledger_kinds(database, dataset_id) == ["RESERVE", "RESERVE", "TOUCH", "RELEASE", "COMMIT"]
    with database.read_session() as session:
        reasons = session.scalars(select(JobEvent.payload).where(JobEvent.kind == "cancelled"))
        assert [payload["reason"] for payload in reasons] == ["dataset-deleted", "dataset-deleted"]
    assert verify_ledger(database).ok


def test_a_running_job_stops_commits_what_it_ran_and_then_its_worker_erases_the_rows(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    """The deletion arrives after the claim, before the worker reads the rows: the rows are still
    there (the erasure waits for the job), the job stops at its first step and commits it, and the
    worker that settled it finishes the deletion."""
    dataset_id = register(alice, rows_csv())
    job_id = alice.post("/v1/jobs", json=small_spec(dataset_id, steps=50)).json()["id"]
    blob_key = row_of(database, dataset_id).blob_key
    runner = JobRunner(settings, db=database)
    load = job_data.load_data_and_units
    answers: list[Any] = []

    def delete_then_load(*args: Any, **kwargs: Any) -> Any:
        answers.append(alice.delete(f"/v1/datasets/{dataset_id}"))
        assert stored(settings, blob_key)  # not while a job may still read it
        meanwhile = upload(alice, rows_csv())  # the same rows: still registered until erased
        assert meanwhile.status_code == 409 and meanwhile.json()["existing_status"] == "deleting"
        assert "once its deletion completes" in meanwhile.json()["detail"]
        return load(*args, **kwargs)

    with mock.patch.object(job_data, "load_data_and_units", side_effect=delete_then_load):
        assert runner.run(job_id) == "cancelled"

    (answer,) = answers
    assert answer.status_code == 202 and answer.json()["status"] == "deleting"
    assert answer.json()["deletion"]["jobs_settling"] == 1
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert 0 < job["steps_run"] < job["steps_planned"] and 0 < job["epsilon_committed"] < job["epsilon_ledger"]
    assert ledger_kinds(database, dataset_id) == ["RESERVE", "TOUCH", "COMMIT", "RELEASE"]
    assert alice.get(f"/v1/datasets/{dataset_id}").json()["status"] == "deleted"
    assert not stored(settings, blob_key)
    assert verify_ledger(database).ok


def test_a_running_tuning_commits_its_whole_charge_when_its_dataset_is_deleted(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    """A running tuning ends at once (its whole reservation committed), so the rows are erased
    without waiting for its slots, which then find nothing to run."""
    dataset_id = register(alice, rows_csv())
    base = small_spec(dataset_id)
    base["evaluation"] = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.1}
    base["training"]["time_limit_s"] = TRIAL_TIME_LIMIT_S
    request = {
        "base": base,
        "search_space": {"training.learning_rate": [0.1, 1.0]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }
    tuning = alice.post("/v1/tuning-jobs", json=request).json()
    queued = alice.post("/v1/tuning-jobs", json=request).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=2):
        assert JobRunner(settings, db=database).run(tuning["job_id"]) == "opened"
    deleted = alice.delete(f"/v1/datasets/{dataset_id}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "deleted"
    assert set(run_slots(settings, database, tuning["job_id"]).values()) == {"skipped"}

    with database.read_session() as session:
        entries = {
            job: [e for e in session.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job))]
            for job in (tuning["job_id"], queued["job_id"])
        }
    ran, waited = entries[tuning["job_id"]], entries[queued["job_id"]]
    assert [e.kind for e in ran] == ["RESERVE", "TOUCH", "COMMIT"] and ran[-1].curve == ran[0].curve
    assert [e.kind for e in waited] == ["RESERVE", "RELEASE"]
    assert alice.get(f"/v1/tuning-jobs/{queued['id']}").json()["status"] == "cancelled"
    assert alice.get(f"/v1/datasets/{dataset_id}").json()["status"] == "deleted"
    assert verify_ledger(database).ok


# --------------------------------------------------------------------------- failures and sharing


def test_an_interrupted_erasure_is_finished_by_the_reconciler(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = register(alice, rows_csv())
    blob_key = row_of(database, dataset_id).blob_key

    def store_down(self: BlobStore, key: str) -> None:
        raise StorageUnavailable("the store is down")

    with mock.patch.object(BlobStore, "delete", store_down):
        answer = alice.delete(f"/v1/datasets/{dataset_id}")
    assert answer.status_code == 202 and answer.json()["status"] == "deleting"
    assert stored(settings, blob_key)
    assert alice.post("/v1/jobs", json=small_spec(dataset_id)).status_code == 409  # no new use meanwhile
    reconcile_once(database, settings, RecordingDispatcher())
    assert alice.get(f"/v1/datasets/{dataset_id}").json()["status"] == "deleted"
    assert not stored(settings, blob_key)


def test_a_blob_another_tenant_registered_too_is_kept_for_it(
    alice: TestClient, bob_headers: dict[str, str], settings: Settings, database: Database
) -> None:
    body = rows_csv()
    mine, theirs = register(alice, body), upload(alice, body, headers=bob_headers).json()["id"]
    blob_key = row_of(database, mine).blob_key
    assert row_of(database, theirs).blob_key == blob_key
    assert alice.delete(f"/v1/datasets/{mine}").status_code == 200
    assert stored(settings, blob_key)  # bob's dataset still holds these bytes
    job = alice.post("/v1/jobs", json=small_spec(theirs), headers=bob_headers).json()["id"]
    assert JobRunner(settings, db=database).run(job) == "succeeded"
    assert alice.delete(f"/v1/datasets/{theirs}", headers=bob_headers).status_code == 200
    assert not stored(settings, blob_key)


@pytest.mark.parametrize("modality", ["image", "text"])
def test_decoded_arrays_are_erased_with_the_upload(
    alice: TestClient, settings: Settings, database: Database, modality: str
) -> None:
    if modality == "image":
        dataset_id = upload_shapes(alice)
    else:
        response = alice.post(
            "/v1/datasets", params={"name": "reviews", "format": "jsonl", "epsilon": 8, "delta": 1e-3},
            content=classification_body(),
        )  # fmt: skip
        assert response.status_code == 201, response.text
        dataset_id = response.json()["id"]
    row = row_of(database, dataset_id)
    assert stored(settings, row.blob_key) and stored(settings, row.array_blob_key)
    assert alice.delete(f"/v1/datasets/{dataset_id}").status_code == 200
    assert not stored(settings, row.blob_key) and not stored(settings, row.array_blob_key)


# --------------------------------------------------------------------------- one content, one budget


def _variant(body: bytes, how: str) -> bytes:
    """The same rows written down another way."""
    text = body.decode()
    if how == "crlf":
        return text.replace("\n", "\r\n").encode()
    if how == "appended newline":
        return (text + "\n").encode()
    header, *lines = text.strip("\n").split("\n")
    if how == "shuffled rows":
        order = np.random.default_rng(7).permutation(len(lines))
        return "\n".join([header, *(lines[i] for i in order)]).encode() + b"\n"
    assert how == "reordered columns"
    table = list(csv.reader(io.StringIO(text)))
    order = list(reversed(range(len(table[0]))))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([[row[i] for i in order] for row in table])
    return out.getvalue().encode()


VARIANTS = ("crlf", "appended newline", "shuffled rows", "reordered columns")


@pytest.mark.parametrize("how", VARIANTS)
def test_the_same_rows_written_another_way_are_refused_while_registered(alice: TestClient, how: str) -> None:
    body = rows_csv()
    dataset_id = register(alice, body)
    again = upload(alice, _variant(body, how), name="copy")
    assert again.status_code == 409, again.text
    assert again.json()["type"] == "/problems/dataset-already-registered"
    assert again.json()["existing_dataset_id"] == dataset_id
    assert len(alice.get("/v1/datasets").json()["items"]) == 1


@pytest.mark.parametrize("how", VARIANTS)
def test_the_same_rows_uploaded_after_a_deletion_continue_the_old_ledger(
    alice: TestClient, settings: Settings, database: Database, how: str
) -> None:
    body = rows_csv()
    dataset_id = register(alice, body)
    run_job(alice, settings, database, dataset_id)
    spent = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert alice.delete(f"/v1/datasets/{dataset_id}").status_code == 200

    again = upload(alice, _variant(body, how), name="rows again", epsilon=100)

    assert again.status_code == 201, again.text
    view = again.json()
    assert view["id"] == dataset_id and view["ledger_continued"] is True and view["status"] == "active"
    assert view["name"] == "rows again" and view["deletion"] is None
    assert view["budget"] == {"epsilon": 8.0, "delta": 1e-5}  # the old budget, not the one declared now
    notice, *public_now = view["notices"]
    assert "its ledger continues" in notice and "was not applied" in notice
    assert any("public class list" in text for text in public_now)  # its new declarations are told too
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["committed_epsilon"] == spent["committed_epsilon"] > 0
    assert budget["entries"] == spent["entries"] and budget["last_hash"] == spent["last_hash"]
    run_job(alice, settings, database, dataset_id)  # the revived dataset trains on its new blob
    assert alice.get(f"/v1/datasets/{dataset_id}/budget").json()["committed_epsilon"] > spent["committed_epsilon"]
    report = verify_ledger(database)
    assert report.ok, report.problems


def test_a_mistaken_upload_is_replaced_with_the_right_label_column(alice: TestClient) -> None:
    """The issue's case: the label column was wrong and the rows were accepted as regression."""
    rng = np.random.default_rng(3)
    features, labels = rng.random((300, 3)), rng.integers(0, 2, 300)
    body = to_csv(np.column_stack([features, labels]), rng.random(300), label="score")  # x3 holds the labels
    wrong = register(alice, body, label_column="score")
    assert alice.get(f"/v1/datasets/{wrong}").json()["task"] == "regression"
    blocked = upload(alice, body, label_column="x3")
    assert blocked.status_code == 409 and f"DELETE /v1/datasets/{wrong}" in blocked.json()["detail"]
    assert alice.delete(f"/v1/datasets/{wrong}").status_code == 200
    corrected = upload(alice, body, label_column="x3", task="classification")
    assert corrected.status_code == 201, corrected.text
    view = corrected.json()
    assert view["id"] == wrong and view["task"] == "classification" and view["label_column"] == "x3"


def test_deleted_private_rows_cannot_come_back_public_or_with_another_privacy_unit(alice: TestClient) -> None:
    rng = np.random.default_rng(5)
    text = "patient,x,label\n" + "".join(f"{i % 60},{rng.random()!r},{i % 2}\n" for i in range(300))
    body = text.encode()
    dataset_id = register(alice, body)
    assert alice.delete(f"/v1/datasets/{dataset_id}").status_code == 200
    public = alice.post(
        "/v1/datasets", params={"name": "p", "format": "csv", "label_column": "label", "public": "true"}, content=body
    )
    assert public.status_code == 409 and public.json()["type"] == "/problems/deleted-content-was-private"
    per_person = upload(alice, body, privacy_unit_column="patient")
    assert per_person.status_code == 409 and per_person.json()["type"] == "/problems/privacy-unit-differs"
    assert alice.get(f"/v1/datasets/{dataset_id}").json()["status"] == "deleted"  # nothing changed
    assert upload(alice, body).json()["ledger_continued"] is True


def test_a_public_dataset_is_deleted_and_registered_again_without_a_ledger(
    alice: TestClient, database: Database
) -> None:
    params = {"name": "open", "format": "csv", "label_column": "label", "public": "true"}
    first = alice.post("/v1/datasets", params=params, content=rows_csv())
    dataset_id = first.json()["id"]
    assert alice.delete(f"/v1/datasets/{dataset_id}").json()["status"] == "deleted"
    again = alice.post("/v1/datasets", params=params, content=_variant(rows_csv(), "crlf"))
    assert again.status_code == 201 and again.json()["id"] == dataset_id and again.json()["ledger_continued"]
    assert ledger_kinds(database, dataset_id) == [] and verify_ledger(database).ok


def test_rows_registered_before_digests_are_recognised_by_their_bytes_and_digested_at_deletion(
    alice: TestClient, database: Database
) -> None:
    """Migration 0016 leaves ``content_digest`` NULL: the bytes' SHA-256 stands for it until the
    deletion (or ``privtrain-admin content-digests``) computes it from the upload."""
    body = rows_csv()
    dataset_id = register(alice, body)
    with database.write_transaction() as tx:
        tx.execute(update(Dataset).where(Dataset.id == dataset_id).values(content_digest=None))
    assert upload(alice, body, name="same bytes").status_code == 409
    assert alice.delete(f"/v1/datasets/{dataset_id}").status_code == 200
    assert row_of(database, dataset_id).content_digest is not None
    again = upload(alice, _variant(body, "crlf"))
    assert again.status_code == 201 and again.json()["id"] == dataset_id and again.json()["ledger_continued"]


def test_an_upload_refused_after_validation_leaves_no_blob(alice: TestClient, settings: Settings) -> None:
    body = rows_csv()
    register(alice, body)
    before = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    assert upload(alice, _variant(body, "crlf")).status_code == 409  # refused under the lock, after parsing
    assert sorted(p for p in settings.blob_dir.rglob("*") if p.is_file()) == before
    assert not any(Path(settings.tmp_dir).glob("upload-*"))
