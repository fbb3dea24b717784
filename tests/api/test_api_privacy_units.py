"""A privacy unit per person through the API and the worker: a CSV with a patient_id column is
registered with n_units public and the column never a feature; its jobs sample persons (q over
units), are charged per person, train on the worker per unit and report the guarantee per
person; algorithms that bound rows only, and specs that would train per row, are refused before
anything is stored."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.ledger.audit import verify_ledger
from kernel.services import Services
from privtrain.cli import CliEnvironment, cli
from privtrain.specs import build_job_spec
from tests.api.worker_jobs import run_on_worker
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.conftest import counts, upload
from tests.text_fixtures import REVIEWS, jsonl
from tests.tuning_run import TRIAL_TIME_LIMIT_S, run_tuning

N_PERSONS = 120


def _patients_csv(*, heavy: int = 200) -> bytes:
    """Visits of N_PERSONS patients: most have 1-5 visits, patient P0 has ``heavy``; two features and a
    label that depends on them."""
    rng = np.random.default_rng(7)
    visits = [heavy, *rng.integers(1, 6, size=N_PERSONS - 1)]
    out = io.StringIO()
    out.write("patient_id,age,dose,label\n")
    for person, count in enumerate(visits):
        for _ in range(int(count)):
            age, dose = rng.normal(size=2)
            out.write(f"P{person},{age:.4f},{dose:.4f},{int(age + dose > 0)}\n")
    return out.getvalue().encode()


def _unit_dataset(alice: TestClient, **params: object) -> dict[str, Any]:
    response = upload(alice, _patients_csv(), name="visits", privacy_unit_column="patient_id", delta=1e-4, **params)
    assert response.status_code == 201, response.text  # type: ignore[attr-defined]
    return dict(response.json())  # type: ignore[attr-defined]


def _spec(dataset_id: str, *, algorithm: str = "dp-sgd", **training: object) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": algorithm, "hyperparameters": {"clipping_norm": 1.0} if algorithm == "dp-sgd" else {}},
        "privacy": {"target_epsilon": 3.0},
        "training": {"epochs": 2, "batch_size": 12, "learning_rate": 0.5, **training},
    }


def test_the_unit_count_is_public_and_the_unit_column_is_never_a_feature(alice: TestClient) -> None:
    body = _unit_dataset(alice)
    assert body["n_units"] == N_PERSONS and body["n_rows"] > 3 * N_PERSONS
    assert body["privacy_unit_column"] == "patient_id"
    assert body["privacy_unit"] == "one patient_id and all its rows"
    assert body["feature_names"] == ["age", "dose"] and body["n_features"] == 2
    assert alice.get(f"/v1/datasets/{body['id']}").json()["n_units"] == N_PERSONS


def test_a_job_samples_and_is_charged_per_person(alice: TestClient) -> None:
    unit_level = _unit_dataset(alice)
    row_level = upload(
        alice, _patients_csv(heavy=199), name="visits-rows", delta=1e-4, preparation='{"drop": ["patient_id"]}'
    ).json()  # type: ignore[attr-defined]
    per_person = alice.post("/v1/jobs/estimate", json=_spec(unit_level["id"])).json()
    per_row = alice.post("/v1/jobs/estimate", json=_spec(row_level["id"])).json()
    assert per_person["sampling_probability"] == pytest.approx(12 / N_PERSONS)
    assert per_row["sampling_probability"] == pytest.approx(12 / row_level["n_rows"])
    event = privacy.PoissonSampledGaussianEvent(
        sampling_probability=12 / N_PERSONS,
        noise_multiplier=per_person["noise_multiplier"],
        count=per_person["steps"],
    )
    assert per_person["epsilon_ledger"] == pytest.approx(privacy.ledger_epsilon(privacy.rdp_curve(event), 1e-4))


def test_a_job_trains_per_person_on_the_worker_and_reports_the_guarantee_per_person(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset = _unit_dataset(alice)
    spec = _spec(dataset["id"])
    spec["evaluation"] = {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.5}
    job_id = run_on_worker(alice, settings, database, spec)
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["spec"]["training"]["rows_per_unit"] == 4  # the default, recorded
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["privacy_unit"] == "one patient_id and all its rows"
    assert report["neighbouring_relation"] == "add/remove one patient_id together with all its rows"
    assert "differential privacy for one patient_id (all of their rows together)" in report["guarantee"]
    assert report["unit_level"]["n_units"] == N_PERSONS and report["unit_level"]["rows_per_unit"] == 4
    assert report["dataset"]["n_units"] == N_PERSONS
    assert "per-unit coin flips" in report["released_metrics"]["holdout_selection"]
    assert verify_ledger(database, dataset_id=dataset["id"]).ok
    html = alice.get(f"/v1/jobs/{job_id}/report", params={"format": "html"}).text
    assert f'id="n-units" data-value="{N_PERSONS}"' in html and "one patient_id and all its rows" in html


@pytest.mark.parametrize(
    ("algorithm", "hyperparameters"),
    [
        ("dc-dpsgd", {"c1": 2.0, "c2": 0.5, "k": 2, "scope": ["1.weight"]}),
        ("dc-dpsgd-threshold", {"c1": 2.0, "c2": 0.5, "k": 2, "tracking": True, "scope": ["1.weight"]}),
        ("dicesgd", {"c1": 1.0, "c2": 1.0}),
        ("dicesgd-adam", {"c1": 1.0, "c2": 1.0}),
    ],
)
def test_dc_dpsgd_and_dicesgd_train_per_person(
    alice: TestClient, settings: Settings, database: Database, algorithm: str, hyperparameters: dict[str, Any]
) -> None:
    """Their name-keyed state (DC-DPSGD's projection scope, DiceSGD's error feedback) sees the
    model's own parameter names on the per-unit path; the charge is per person."""
    dataset = _unit_dataset(alice)
    spec = _spec(dataset["id"], algorithm=algorithm, rows_per_unit=2)
    spec["algorithm"]["hyperparameters"] = hyperparameters
    estimate = alice.post("/v1/jobs/estimate", json=spec)
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["sampling_probability"] == pytest.approx(12 / N_PERSONS)
    job_id = run_on_worker(alice, settings, database, spec)
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job
    assert job["spec"]["training"]["rows_per_unit"] == 2
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["privacy_unit"] == "one patient_id and all its rows"
    assert report["unit_level"]["n_units"] == N_PERSONS
    assert verify_ledger(database, dataset_id=dataset["id"]).ok


@pytest.mark.parametrize("algorithm", ["kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point"])
def test_the_kl_family_trains_on_every_person_each_step(
    alice: TestClient, settings: Settings, database: Database, algorithm: str
) -> None:
    """Full batch per person: every release uses each person's mean gradient over their row slots
    as one clipped term, normalised by the public number of persons (recorded as the batch size)."""
    dataset = _unit_dataset(alice)
    spec = {
        "dataset_id": dataset["id"],
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": algorithm, "hyperparameters": {}},
        "privacy": {"target_epsilon": 3.0},
        "training": {"steps": 4, "rows_per_unit": 3},
    }
    estimate = alice.post("/v1/jobs/estimate", json=spec)
    assert estimate.status_code == 200, estimate.text
    assert estimate.json()["sampling_probability"] == 1.0
    job_id = run_on_worker(alice, settings, database, spec)
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded", job
    assert job["spec"]["training"]["batch_size"] == N_PERSONS  # every person, not every row
    assert job["spec"]["training"]["rows_per_unit"] == 3
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["privacy_unit"] == "one patient_id and all its rows"
    assert verify_ledger(database, dataset_id=dataset["id"]).ok


@pytest.mark.parametrize("algorithm", ["ht-dp-fw", "ht-sparse-linreg"])
def test_an_algorithm_that_bounds_rows_only_is_refused(alice: TestClient, database: Database, algorithm: str) -> None:
    dataset = _unit_dataset(alice)
    before = counts(database)
    spec = _spec(dataset["id"], algorithm=algorithm)
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/privacy-unit-unsupported"
    assert "dp-sgd" in problem["detail"] and "patient_id" in problem["detail"]
    assert counts(database) == before


def test_a_job_cannot_switch_a_unit_level_dataset_back_to_rows(alice: TestClient, database: Database) -> None:
    dataset = _unit_dataset(alice)
    before = counts(database)
    for spec in (
        {**_spec(dataset["id"]), "privacy_unit": "row"},
        _spec(dataset["id"], rows_per_unit=0),
        _spec(dataset["id"], batch_size=N_PERSONS + 1),  # more units than there are
    ):
        response = alice.post("/v1/jobs", json=spec)
        assert response.status_code == 422, response.text
    assert counts(database) == before
    # whatever rows_per_unit says, sampling stays over persons
    one_row = alice.post("/v1/jobs/estimate", json=_spec(dataset["id"], rows_per_unit=1)).json()
    assert one_row["sampling_probability"] == pytest.approx(12 / N_PERSONS)


def test_rows_per_unit_on_a_row_level_dataset_is_refused(alice: TestClient) -> None:
    row_level = upload(alice, _patients_csv(), name="rows", delta=1e-4, preparation='{"drop": ["patient_id"]}')
    response = alice.post("/v1/jobs/estimate", json=_spec(row_level.json()["id"], rows_per_unit=2))  # type: ignore[attr-defined]
    assert response.status_code == 422
    assert response.json()["type"] == "/problems/rows-per-unit-needs-privacy-units"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        (
            {"privacy_unit_column": "patient_id", "public": True, "epsilon": None, "delta": None},
            "privacy-unit-on-public-dataset",
        ),
        ({"privacy_unit_column": "person"}, "invalid-dataset/missing-privacy-unit-column"),
        ({"privacy_unit_column": "label"}, "invalid-dataset/bad-privacy-unit-column"),
        ({"privacy_unit_column": "patient_id", "format": "npz"}, "invalid-dataset/privacy-unit-unsupported-format"),
        ({"privacy_unit_column": "patient_id", "delta": 1 / 100}, "invalid-budget"),  # δ must be < 1/n_units
    ],
)
def test_a_bad_unit_declaration_is_refused_and_leaves_nothing(
    alice: TestClient, params: dict[str, object], problem: str
) -> None:
    services: Services = alice.app.state.services  # type: ignore[attr-defined]
    before = {p for p in services.blobs.root.rglob("*") if p.is_file()}
    query = {k: v for k, v in params.items() if v is not None}
    if params.get("public"):
        query = {"name": "v", "format": "csv", "label_column": "label", **query}
        response = alice.post("/v1/datasets", params=query, content=_patients_csv())
    else:
        response = upload(alice, _patients_csv(), **query)  # type: ignore[assignment]
    assert response.status_code == 422, response.text  # type: ignore[attr-defined]
    slug, _, reason = problem.partition("/")
    assert response.json()["type"] == f"/problems/{slug}"  # type: ignore[attr-defined]
    if reason:
        assert response.json()["reason"] == reason  # type: ignore[attr-defined]
    after = {p for p in services.blobs.root.rglob("*") if p.is_file() and "tmp" not in p.parts}
    assert after <= before
    assert alice.get("/v1/datasets").json()["items"] == []


def test_the_cli_uploads_with_a_unit_column_and_sends_rows_per_unit(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key}
    path = tmp_path / "visits.csv"
    path.write_bytes(_patients_csv())

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, list(args), obj=CliEnvironment(transport=transport), env=env)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        return result.stdout

    shown = run(
        "datasets", "upload", str(path), "--epsilon", "4", "--delta", "1e-4", "--privacy-unit-column", "patient_id"
    )
    assert f"one patient_id and all its rows ({N_PERSONS} units)" in shown
    listed = json.loads(run("datasets", "list", "--json"))
    dataset_id = (listed["items"] if isinstance(listed, dict) else listed)[0]["id"]
    estimate = json.loads(
        run(
            "jobs", "estimate", "--dataset", dataset_id, "--algorithm", "dp-sgd", "--model", "logistic-regression",
            "--target-epsilon", "2", "--epochs", "1", "--batch-size", "12", "--lr", "0.5", "--rows-per-unit", "2",
            "--json",
        )
    )  # fmt: skip
    assert estimate["sampling_probability"] == pytest.approx(12 / N_PERSONS)
    assert build_job_spec(dataset_id="ds_x", model="m", algorithm="dp-sgd", steps=3, rows_per_unit=2)["training"] == {
        "steps": 3,
        "rows_per_unit": 2,
    }


def test_a_tuning_on_a_unit_level_dataset_trains_and_evaluates_per_person(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset = _unit_dataset(alice)
    base = _spec(dataset["id"])
    base["evaluation"] = {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 0.5}
    base["training"]["time_limit_s"] = TRIAL_TIME_LIMIT_S
    request = {
        "base": base,
        "search_space": {"training.learning_rate": [0.1, 1.0], "training.rows_per_unit": [1, 3]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }
    estimate = alice.post("/v1/tuning-jobs/estimate", json=request).json()
    assert [c["sampling_probability"] for c in estimate["candidates"]] == [pytest.approx(12 / (0.75 * N_PERSONS))] * 4
    created = alice.post("/v1/tuning-jobs", json=request).json()
    status = run_tuning(settings, database, created["job_id"])
    done = alice.get(f"/v1/tuning-jobs/{created['id']}").json()
    assert status == "succeeded", done
    report = alice.get(f"/v1/jobs/{done['best_job_id']}/report").json()
    assert report["privacy_unit"] == "one patient_id and all its rows"
    assert report["unit_level"]["rows_per_unit"] == done["selected"]["training.rows_per_unit"]
    assert "per-unit coin flips" in report["released_metrics"]["holdout_selection"]
    assert verify_ledger(database, dataset_id=dataset["id"]).ok


def _messages(users: int = 12) -> bytes:
    """Messages of ``users`` users (user u writes u + 1 of them), with a label, as JSON Lines."""
    records = [
        {"user": f"u{u}", "text": text, "label": label}
        for u in range(users)
        for text, label in REVIEWS[: (u % len(REVIEWS)) + 1]
    ]
    return jsonl(records)


@pytest.mark.parametrize("task", ["classification", "language-model"])
def test_texts_with_a_user_member_train_per_user(
    alice: TestClient, settings: Settings, database: Database, task: str
) -> None:
    body = (
        _messages()
        if task == "classification"
        else _messages().replace(b', "label": "good"', b"").replace(b', "label": "bad"', b"")
    )
    params = {"name": f"messages-{task}", "format": "jsonl", "max_length": 16, "task": task}
    response = upload(alice, body, privacy_unit_column="user", delta=1e-3, **params)
    assert response.status_code == 201, response.text  # type: ignore[attr-defined]
    dataset = response.json()  # type: ignore[attr-defined]
    assert dataset["n_units"] == 12 and dataset["privacy_unit"] == "one user and all its rows"
    model = "transformer-classifier" if task == "classification" else "transformer-lm"
    params_ = {
        "layers": 1,
        "dim": 8,
        "heads": 2,
        "mlp_dim": 16,
        **({"pooling": "first"} if task == "classification" else {}),
    }
    spec = {
        "dataset_id": dataset["id"],
        "model": {"name": model, "params": params_},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 3, "batch_size": 4, "learning_rate": 0.1, "rows_per_unit": 2},
    }
    assert alice.post("/v1/jobs/estimate", json=spec).json()["sampling_probability"] == pytest.approx(4 / 12)
    job_id = run_on_worker(alice, settings, database, spec)
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["unit_level"]["n_units"] == 12 and report["unit_level"]["rows_per_unit"] == 2


def test_a_text_record_without_its_user_is_refused(alice: TestClient) -> None:
    body = jsonl([{"user": "u1", "text": "a fine film", "label": "good"}, {"text": "dull", "label": "bad"}])
    response = upload(alice, body, name="m", format="jsonl", privacy_unit_column="user", delta=1e-3)
    assert response.status_code == 422  # type: ignore[attr-defined]
    problem = response.json()  # type: ignore[attr-defined]
    assert problem["type"] == "/problems/jsonl-missing-field" and "line 2" in problem["detail"]
    assert alice.get("/v1/datasets").json()["items"] == []
