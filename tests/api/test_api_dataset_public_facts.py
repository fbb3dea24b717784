"""Only declared-public facts reach non-owners, and one content gets one budget (docs/privacy-model.md §2, §3).

Each test here fails on the service as it was before: analysts saw the content hash and byte size,
the class count was max(label) + 1, and re-uploading the same bytes registered a second dataset
with a second full budget.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, LedgerEntry, PrivacyBudget
from tests.conftest import to_csv, upload
from tests.sharing import share


def _counts(database: Database) -> tuple[int, int, int]:
    with database.session() as session:
        return (
            session.scalar(select(func.count()).select_from(Dataset)) or 0,
            session.scalar(select(func.count()).select_from(PrivacyBudget)) or 0,
            session.scalar(select(func.count()).select_from(LedgerEntry)) or 0,
        )


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _grant(alice: TestClient, dataset_id: str, bob_headers: dict[str, str]) -> None:
    share(alice, dataset_id=dataset_id, grantee_name="bob", grantee=bob_headers)
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob_headers).status_code == 200


# ------------------------------------------------------------------ one content, one budget


def test_reuploading_the_same_bytes_is_refused_and_names_the_dataset(
    alice: TestClient, digits_csv: bytes, database: Database, settings: Settings
) -> None:
    first = upload(alice, digits_csv)
    assert first.status_code == 201, first.text
    before = (_counts(database), _files(settings.blob_dir))
    again = upload(alice, digits_csv, name="digits-again", epsilon=8)
    assert again.status_code == 409
    assert again.headers["content-type"].startswith("application/problem+json")
    problem = again.json()
    assert problem["type"] == "/problems/dataset-already-registered"
    assert problem["existing_dataset_id"] == first.json()["id"]
    assert first.json()["id"] in problem["detail"] and "budget" in problem["detail"]
    assert problem["links"]["raise_budget"] == f"/v1/datasets/{first.json()['id']}/budget"
    # Nothing left behind: no row, no budget, no ledger entry, no new blob, no temp file.
    assert (_counts(database), _files(settings.blob_dir)) == before
    assert _files(settings.tmp_dir) == []
    # The audited path to spend more on the same rows still works.
    raised = alice.post(f"/v1/datasets/{first.json()['id']}/budget", json={"epsilon": 16, "reason": "more"})
    assert raised.status_code == 200 and raised.json()["epsilon"] == 16


def test_the_same_bytes_in_another_tenant_are_another_dataset(
    alice: TestClient, digits_csv: bytes, bob_headers: dict[str, str]
) -> None:
    """Tenants are separate data controllers; a 409 across tenants would also reveal that some
    other tenant holds these bytes."""
    assert upload(alice, digits_csv).status_code == 201
    theirs = alice.post(
        "/v1/datasets",
        headers=bob_headers,
        content=digits_csv,
        params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
    )
    assert theirs.status_code == 201, theirs.text


def test_an_idempotent_retry_is_not_a_duplicate(alice: TestClient, digits_csv: bytes) -> None:
    headers = {"Idempotency-Key": "retry-1"}
    params = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    first = alice.post("/v1/datasets", headers=headers, params=params, content=digits_csv)
    again = alice.post("/v1/datasets", headers=headers, params=params, content=digits_csv)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other_key = alice.post("/v1/datasets", headers={"Idempotency-Key": "retry-2"}, params=params, content=digits_csv)
    assert other_key.status_code == 409
    assert other_key.json()["existing_dataset_id"] == first.json()["id"]


# ------------------------------------------------------------------ exact functions of the rows


def test_hash_and_size_are_the_owners_only(alice: TestClient, digits_csv: bytes, bob_headers: dict[str, str]) -> None:
    owner_view = upload(alice, digits_csv).json()
    assert owner_view["sha256"] == hashlib.sha256(digits_csv).hexdigest()
    assert owner_view["size_bytes"] == len(digits_csv)
    _grant(alice, owner_view["id"], bob_headers)
    for body in (
        alice.get(f"/v1/datasets/{owner_view['id']}", headers=bob_headers).text,
        alice.get("/v1/datasets", headers=bob_headers).text,
        alice.get(f"/v1/datasets/{owner_view['id']}/budget", headers=bob_headers).text,
    ):
        assert owner_view["sha256"] not in body
        assert f'"size_bytes":{len(digits_csv)}' not in body.replace(" ", "")
    analyst_view = alice.get(f"/v1/datasets/{owner_view['id']}", headers=bob_headers).json()
    assert analyst_view["sha256"] is None and analyst_view["size_bytes"] is None
    assert analyst_view["n_rows"] == owner_view["n_rows"] and analyst_view["classes"] == owner_view["classes"]


# ------------------------------------------------------------------ the class list


def _labelled(seed: int, labels: np.ndarray) -> bytes:
    rng = np.random.default_rng(seed)
    return to_csv(rng.random((labels.size, 3)), labels)


def test_a_declared_class_list_does_not_depend_on_the_rows(alice: TestClient) -> None:
    """Two datasets of the same n, one row apart: the only row with label 2 is missing in one.
    Observed lists differ (the old max(label) + 1 leak); declared lists are identical."""
    labels = np.array([0, 1] * 20 + [2])
    neighbour = labels.copy()
    neighbour[-1] = 0
    names = "healthy,benign,malignant"
    views = [
        upload(alice, _labelled(seed, y), name=f"d{seed}", classes=names, delta=1e-3).json()
        for seed, y in ((1, labels), (2, neighbour))
    ]
    for view in views:
        assert view["classes"] == ["healthy", "benign", "malignant"]
        assert view["classes_source"] == "declared" and view["n_classes"] == 3
        assert view["notices"] == []
    observed = [
        upload(alice, _labelled(seed, y), name=f"o{seed}", delta=1e-3).json()
        for seed, y in ((3, labels), (4, neighbour))
    ]
    assert [v["n_classes"] for v in observed] == [3, 2]
    for view in observed:
        assert view["classes_source"] == "observed"
        assert view["classes"] == [str(i) for i in range(view["n_classes"])]
        task_notice, classes_notice = view["notices"]  # neither the task nor the list was given
        assert "inferred from the labels (classification)" in task_notice and "task=" in task_notice
        assert "public class list" in classes_notice and "classes=" in classes_notice
    given_task = upload(alice, _labelled(9, labels), name="t", task="classification", delta=1e-3).json()
    assert len(given_task["notices"]) == 1 and "class list" in given_task["notices"][0]
    # The notice belongs to the upload response; later reads do not repeat it.
    assert alice.get(f"/v1/datasets/{observed[0]['id']}").json()["notices"] == []


def test_labels_outside_the_declared_list_are_refused_without_leaving_anything(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    body = _labelled(5, np.array([0, 1, 2, 9] + [0, 1, 2, 0] * 9))
    response = upload(alice, body, classes="a,b,c", delta=1e-3)
    assert response.status_code == 422
    problem = response.json()
    assert problem["type"] == "/problems/invalid-dataset" and problem["reason"] == "label-not-in-classes"
    assert "line 5" in problem["detail"] and "9" not in problem["detail"]  # the row, never the value
    assert _counts(database) == (0, 0, 0) and _files(settings.blob_dir) == [] and _files(settings.tmp_dir) == []


def test_malformed_class_lists_are_refused_before_the_body_is_read(alice: TestClient, database: Database) -> None:
    body = _labelled(6, np.array([0, 1] * 10))
    for classes, task in (("a", None), ("a,a", None), ("a,,b", None), ("a\x00,b", None), ("a,b", "regression")):
        params = {"classes": classes} | ({"task": task} if task else {})
        response = upload(alice, body, delta=1e-3, **params)
        assert response.status_code == 422, (classes, response.text)
        assert response.json()["reason"] == "bad-class-list"
    assert _counts(database) == (0, 0, 0)


def test_the_class_list_is_part_of_an_idempotent_upload(alice: TestClient) -> None:
    body = _labelled(7, np.array([0, 1] * 10))
    params = {"name": "d", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-3}
    headers = {"Idempotency-Key": "classes-1"}
    first = alice.post("/v1/datasets", headers=headers, params=params | {"classes": "no,yes"}, content=body)
    assert first.status_code == 201 and first.json()["classes"] == ["no", "yes"]
    changed = alice.post("/v1/datasets", headers=headers, params=params | {"classes": "yes,no"}, content=body)
    assert changed.status_code == 422 and changed.json()["type"] == "/problems/idempotency-key-reused"


def test_a_report_names_the_dataset_by_hash_for_its_owner_only(
    alice: TestClient, settings: Settings, database: Database, bob_headers: dict[str, str]
) -> None:
    from worker.runner import JobRunner

    body = _labelled(8, np.array([0, 1] * 150))
    dataset = upload(alice, body, classes="no,yes", delta=1e-3).json()
    _grant(alice, dataset["id"], bob_headers)
    spec = {
        "dataset_id": dataset["id"],
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": 1.0},
        "training": {"steps": 3, "batch_size": 64, "learning_rate": 0.5},
    }
    job = alice.post("/v1/jobs", json=spec, headers=bob_headers)
    assert job.status_code == 202, job.text
    assert JobRunner(settings, db=database).run(job.json()["id"]) == "succeeded"
    path = f"/v1/jobs/{job.json()['id']}/report"
    owners = alice.get(path).json()["dataset"]
    assert owners["sha256"] == hashlib.sha256(body).hexdigest()
    assert owners["classes"] == ["no", "yes"] and owners["classes_source"] == "declared"
    for fmt in ("json", "html"):
        analysts = alice.get(path, params={"format": fmt}, headers=bob_headers)
        assert analysts.status_code == 200
        assert owners["sha256"] not in analysts.text
        assert dataset["id"] in analysts.text and "no, yes" in alice.get(path, params={"format": "html"}).text
    analyst_json = alice.get(path, headers=bob_headers).json()["dataset"]
    assert "sha256" not in analyst_json and analyst_json["name"] == dataset["name"]
    assert owners["sha256"] in alice.get(path, params={"format": "html"}).text
