"""The exact row count of a person-level dataset (issue 35, item 7): under add/remove of one
person it changes by that person's number of rows, so it is shown to the owner only unless the
owner declares it public at upload; the number of persons stays public, and everything public
about a job on such a dataset is computed from it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.test_api_privacy_units import N_PERSONS, _patients_csv, _spec
from tests.conftest import counts, new_key, upload
from tests.sharing import share
from worker.runner import JobRunner


@pytest.fixture
def bob(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'bob')}"}


def _visits(alice: TestClient, **params: object) -> dict[str, Any]:
    response = upload(alice, _patients_csv(), name="visits", privacy_unit_column="patient_id", delta=1e-4, **params)
    assert response.status_code == 201, response.text  # type: ignore[attr-defined]
    return dict(response.json())  # type: ignore[attr-defined]


def _bobs_job(alice: TestClient, bob: dict[str, str], settings: Settings, database: Database, dataset_id: str) -> str:
    submitted = alice.post("/v1/jobs", json=_spec(dataset_id), headers=bob)
    assert submitted.status_code == 202, submitted.text
    job_id = str(submitted.json()["id"])
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    return job_id


def test_a_person_level_row_count_is_the_owners_only_by_default(
    alice: TestClient, bob: dict[str, str], settings: Settings, database: Database
) -> None:
    dataset = _visits(alice)
    n_rows = dataset["n_rows"]
    assert n_rows > N_PERSONS and dataset["n_rows_public"] is False  # the owner's upload answer has it
    share(alice, dataset_id=dataset["id"], grantee_name="bob", grantee=bob)
    seen = alice.get(f"/v1/datasets/{dataset['id']}", headers=bob).json()
    assert seen["n_rows"] is None and seen["n_units"] == N_PERSONS and seen["n_rows_public"] is False
    [listed] = alice.get("/v1/datasets", headers=bob).json()["items"]
    assert listed["n_rows"] is None
    assert alice.get(f"/v1/datasets/{dataset['id']}").json()["n_rows"] == n_rows  # the owner's view

    job_id = _bobs_job(alice, bob, settings, database, dataset["id"])
    report = alice.get(f"/v1/jobs/{job_id}/report", headers=bob).json()
    assert report["dataset"]["n_rows"] is None and report["unit_level"]["n_rows"] is None
    assert report["unit_level"]["n_units"] == N_PERSONS
    [caveat] = [c for c in report["caveats"] if "exact row count" in c]
    assert "changes it by that patient_id's number of rows" in caveat and "shown to the owner only" in caveat
    html = alice.get(f"/v1/jobs/{job_id}/report", headers=bob, params={"format": "html"}).text
    assert f'data-value="{n_rows}"' not in html and "withheld: on this person-level dataset" in html
    owners = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert owners["dataset"]["n_rows"] == owners["unit_level"]["n_rows"] == n_rows
    owners_html = alice.get(f"/v1/jobs/{job_id}/report", params={"format": "html"}).text
    assert f'id="n-rows" data-value="{n_rows}"' in owners_html
    page = alice.get(f"/ui/datasets/{dataset['id']}", headers=bob)
    assert page.status_code == 200 and 'id="n-rows-withheld"' in page.text


def test_the_owner_may_declare_the_row_count_public(
    alice: TestClient, bob: dict[str, str], settings: Settings, database: Database
) -> None:
    dataset = _visits(alice, n_rows_public="true")
    share(alice, dataset_id=dataset["id"], grantee_name="bob", grantee=bob)
    seen = alice.get(f"/v1/datasets/{dataset['id']}", headers=bob).json()
    assert seen["n_rows"] == dataset["n_rows"] and seen["n_rows_public"] is True
    job_id = _bobs_job(alice, bob, settings, database, dataset["id"])
    report = alice.get(f"/v1/jobs/{job_id}/report", headers=bob).json()
    assert report["dataset"]["n_rows"] == report["unit_level"]["n_rows"] == dataset["n_rows"]
    assert any("declared it public at upload" in c for c in report["caveats"])


def test_a_row_level_row_count_stays_public_and_cannot_be_declared(
    alice: TestClient, bob: dict[str, str], database: Database, digits_csv: bytes
) -> None:
    dataset = upload(alice, digits_csv).json()  # type: ignore[attr-defined]
    share(alice, dataset_id=dataset["id"], grantee_name="bob", grantee=bob)
    assert alice.get(f"/v1/datasets/{dataset['id']}", headers=bob).json()["n_rows"] == dataset["n_rows"]
    before = counts(database)
    refused = upload(alice, digits_csv, name="again", n_rows_public="true")
    assert refused.status_code == 422  # type: ignore[attr-defined]
    assert refused.json()["type"] == "/problems/n-rows-public-without-privacy-unit"  # type: ignore[attr-defined]
    assert counts(database) == before


def test_a_budget_raise_holds_delta_below_one_over_the_number_of_persons(alice: TestClient) -> None:
    dataset = _visits(alice)
    assert 1 / dataset["n_rows"] < 0.005 < 1 / N_PERSONS
    raised = alice.post(f"/v1/datasets/{dataset['id']}/budget", json={"epsilon": 9, "delta": 0.005})
    assert raised.status_code == 200, raised.text
    refused = alice.post(f"/v1/datasets/{dataset['id']}/budget", json={"epsilon": 10, "delta": 1 / N_PERSONS})
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/invalid-budget"
