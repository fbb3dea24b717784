"""Data preparation a new user needs (issue 14): text and 1-based labels, an explicit task, text
feature columns (drop or one-hot over declared categories) and scaling by public bounds, applied
by the worker and stated in the report and the model's config.

Each test fails on the service as it was before: text labels and text columns were refused as
"not a number", {1, 2} labels silently became a regression (or 3 classes with an empty class 0),
and there was no way to declare a preparation.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from bench.breast_cancer_csv import CLASSES, preparation, training_csv
from dp.data.rows import materialise
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, LedgerEntry, PrivacyBudget
from privtrain_common.model_files import load_model
from tests.conftest import upload
from tests.sharing import share
from worker.job_data import load_data_and_units
from worker.runner import JobRunner


def _stored(database: Database, settings: Settings) -> tuple[int, int, int, list[Path]]:
    """Rows, budgets, ledger entries and blob files: what a refused upload must leave unchanged."""
    with database.read_session() as session:
        counts = tuple(
            session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Dataset, PrivacyBudget, LedgerEntry)
        )
    blobs = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    return (*counts, blobs)  # type: ignore[return-value]


def _loaded(settings: Settings, database: Database, dataset_id: str) -> tuple[np.ndarray, np.ndarray]:
    """What the worker trains on: its own loading code, on the stored dataset."""
    with database.read_session() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        session.expunge(dataset)
    data = load_data_and_units(JobRunner(settings, db=database).ctx, dataset, torch.device("cpu"))
    X, y = data.rows, data.y
    return materialise(X).numpy(), y.numpy()


def _csv(header: list[str], rows: list[list[object]]) -> bytes:
    lines = [",".join(header), *(",".join(str(cell) for cell in row) for row in rows)]
    return ("\n".join(lines) + "\n").encode()


def _run_tiny_job(alice: TestClient, settings: Settings, database: Database, dataset_id: str) -> str:
    spec = {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": 1.0},
        "training": {"steps": 3, "batch_size": 64, "learning_rate": 0.5},
    }
    job = alice.post("/v1/jobs", json=spec)
    assert job.status_code == 202, job.text
    assert JobRunner(settings, db=database).run(job.json()["id"]) == "succeeded"
    return job.json()["id"]


# ------------------------------------------------------ the worked example of docs/preparing-data.md


def test_the_breast_cancer_example_runs_end_to_end(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    """docs/preparing-data.md's worked example: a hospital-style CSV (patient_id, 30 measurements, diagnosis
    as words) uploaded with a declared class list, the id dropped and public bounds."""
    body = training_csv()
    declared = preparation()
    response = upload(
        alice,
        body,
        name="breast-cancer",
        label_column="diagnosis",
        delta=1e-3,
        classes=",".join(CLASSES),
        preparation=json.dumps(declared),
    )
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["classes"] == ["benign", "malignant"] and dataset["classes_source"] == "declared"
    assert dataset["task"] == "classification" and dataset["n_classes"] == 2
    assert dataset["n_rows"] == 455 and dataset["n_features"] == 30
    assert "patient_id" not in dataset["feature_names"] and len(dataset["feature_names"]) == 30
    assert dataset["preparation"]["drop"] == ["patient_id"]
    assert dataset["preparation"]["scale"]["mean area"] == {"bounds": [0.0, 4500.0], "range": [0.0, 1.0]}
    assert dataset["notices"] == []  # everything public was declared

    # The worker trains on scaled features and labels matched by name.
    X, y = _loaded(settings, database, dataset["id"])
    assert X.shape == (455, 30) and X.min() >= 0.0 and X.max() <= 1.0
    malignant_rows = body.decode().count(",malignant\n")
    assert int((y == CLASSES.index("malignant")).sum()) == malignant_rows and set(np.unique(y)) == {0, 1}

    job_id = _run_tiny_job(alice, settings, database, dataset["id"])
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    block = report["preparation"]
    assert block["declared"] is True
    assert block["drop"] == ["patient_id"] and block["scale"] == dataset["preparation"]["scale"]
    assert "no privacy" in block["privacy"]
    path = tmp_path / "model.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    model, config = load_model(path)
    assert config["classes"] == ["benign", "malignant"] and config["n_outputs"] == 2
    assert config["preparation"] == dataset["preparation"] and config["feature_names"] == dataset["feature_names"]
    with torch.no_grad():
        assert model(torch.from_numpy(X[:4])).shape == (4, 2)


# ------------------------------------------------------------------ labels and the task


def test_undeclared_text_labels_become_the_sorted_observed_list(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    rng = np.random.default_rng(1)
    words = rng.choice(["yes", "no", "maybe"], size=60)
    body = _csv(["a", "b", "answer"], [[float(rng.random()), float(rng.random()), w] for w in words])
    response = upload(alice, body, label_column="answer", delta=1e-3)
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["classes"] == ["maybe", "no", "yes"] and dataset["classes_source"] == "observed"
    task_notice, classes_notice = dataset["notices"]
    assert "inferred from the labels (classification)" in task_notice
    assert "3 distinct labels found, sorted" in classes_notice and "classes=" in classes_notice
    _, y = _loaded(settings, database, dataset["id"])
    np.testing.assert_array_equal(y, [["maybe", "no", "yes"].index(w) for w in words])


def test_one_based_labels_need_a_task_and_are_matched_by_name(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    labels = [1, 2] * 15 + [2]
    body = _csv(["a", "label"], [[i / 10, label] for i, label in enumerate(labels)])
    before = _stored(database, settings)
    ambiguous = upload(alice, body, delta=1e-3)
    assert ambiguous.status_code == 422
    assert ambiguous.json()["reason"] == "ambiguous-task" and "task=" in ambiguous.json()["detail"]
    assert _stored(database, settings) == before
    as_classes = upload(alice, body, delta=1e-3, task="classification")
    assert as_classes.status_code == 201, as_classes.text
    assert as_classes.json()["classes"] == ["1", "2"] and as_classes.json()["n_classes"] == 2  # no empty class 0
    _, y = _loaded(settings, database, as_classes.json()["id"])
    np.testing.assert_array_equal(y, np.array(labels) - 1)

    other_bytes = body + b"0.5,1\n"
    declared = upload(alice, other_bytes, name="declared", delta=1e-3, classes="1,2")
    assert declared.status_code == 201 and declared.json()["classes_source"] == "declared"
    _, y = _loaded(settings, database, declared.json()["id"])
    assert y[0] == 0 and y[1] == 1  # label "1" is the name "1": index 0, by name, never shifted
    named = upload(alice, other_bytes + b"0.6,2\n", name="named", delta=1e-3, classes="no,yes")
    assert named.status_code == 422 and named.json()["reason"] == "label-not-in-classes"
    assert "classes=1,2" in named.json()["detail"]


# ------------------------------------------------------------------ text feature columns


def test_a_text_column_is_refused_with_the_owners_choices(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    body = _csv(["patient_id", "age", "label"], [[f"SECRET{i}", 40 + i, i % 2] for i in range(20)])
    before = _stored(database, settings)
    response = upload(alice, body, delta=1e-3)
    assert response.status_code == 422
    problem = response.json()
    assert problem["reason"] == "non-numeric"
    detail = problem["detail"]
    assert "line 2" in detail and "'patient_id'" in detail and "SECRET" not in detail
    assert '{"drop": ["patient_id"]}' in detail and '"one_hot"' in detail and "privacy unit" in detail
    assert _stored(database, settings) == before
    dropped = upload(alice, body, delta=1e-3, preparation='{"drop": ["patient_id"]}')
    assert dropped.status_code == 201, dropped.text
    assert dropped.json()["feature_names"] == ["age"] and dropped.json()["n_features"] == 1


def test_one_hot_encodes_declared_categories_and_refuses_others(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    sexes = ["female", "male", " male ", "female"] * 5
    rows = [[s, 30 + i, i % 2] for i, s in enumerate(sexes)]
    declared = json.dumps(
        {"one_hot": {"sex": ["female", "male", "other"]}, "scale": {"age": {"bounds": [0, 100], "range": [-1, 1]}}}
    )
    response = upload(alice, _csv(["sex", "age", "label"], rows), delta=1e-3, preparation=declared)
    assert response.status_code == 201, response.text
    assert response.json()["feature_names"] == ["sex=female", "sex=male", "sex=other", "age"]
    X, _ = _loaded(settings, database, response.json()["id"])
    expected = np.array([[s.strip() == c for c in ("female", "male", "other")] for s in sexes], dtype=np.float32)
    np.testing.assert_array_equal(X[:, :3], expected)
    np.testing.assert_allclose(X[:, 3], [(30 + i) / 50 - 1 for i in range(len(sexes))], rtol=1e-6)

    before = _stored(database, settings)
    unknown = [*rows, ["SECRETSEX", 50, 1]]
    refused = upload(alice, _csv(["sex", "age", "label"], unknown), delta=1e-3, preparation=declared)
    assert refused.status_code == 422
    assert refused.json()["reason"] == "unknown-category"
    assert "line 22" in refused.json()["detail"] and "'sex'" in refused.json()["detail"]
    assert "SECRETSEX" not in refused.text
    assert _stored(database, settings) == before


# ------------------------------------------------------------------ the declaration itself


@pytest.mark.parametrize(
    ("declared", "names"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"dorp": ["a"]}', "'dorp'"),
        ('{"drop": "a"}', "drop must be a list"),
        ('{"drop": ["a", "a"]}', "twice"),
        ('{"one_hot": {"a": []}}', "1 to 1000 categories"),
        ('{"one_hot": {"a": ["x", "x"]}}', "twice"),
        ('{"scale": {"a": {"bounds": [1, 1]}}}', "low < high"),
        ('{"scale": {"a": {"bounds": [0, 1], "range": [0, 2]}}}', "[-1, 1]"),
        ('{"scale": {"a": {"center": 0, "scale": 0}}}', "positive"),
        ('{"scale": {"a": {"center": 0, "scale": NaN}}}', "finite"),
        ('{"scale": {"a": {"bounds": [0, true]}}}', "number"),
        ('{"scale": {"a": {"mean": 0}}}', '"bounds"'),
        ('{"drop": ["a"], "scale": {"a": {"center": 0, "scale": 1}}}', "more than one"),
        ('{"drop": ["zzz"]}', "not among the 3 header columns"),
        ('{"drop": ["label"]}', "label column"),
        ('{"drop": ["a", "b"]}', "no feature columns"),
        ("[" * 5000 + "]" * 5000, "JSON"),
    ],
)
def test_malformed_declarations_are_refused_naming_the_problem(
    alice: TestClient, settings: Settings, database: Database, declared: str, names: str
) -> None:
    body = _csv(["a", "b", "label"], [[i, i * 2, i % 2] for i in range(20)])
    before = _stored(database, settings)
    response = upload(alice, body, delta=1e-3, preparation=declared)
    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/invalid-dataset"
    assert response.json()["reason"] in ("bad-preparation", "empty-dataset")
    assert names in response.json()["detail"]
    assert _stored(database, settings) == before


def test_an_array_dataset_takes_only_scaling_of_every_feature(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    rng = np.random.default_rng(2)
    buffer = io.BytesIO()
    np.savez(buffer, X=rng.integers(0, 17, (40, 1, 4, 4)).astype(np.float32), y=np.arange(40) % 2)
    named = upload(
        alice, buffer.getvalue(), format="npz", label_column=None, delta=1e-3, preparation='{"drop": ["x0"]}'
    )
    assert named.status_code == 422 and 'only scale["*"]' in named.json()["detail"]
    scaled = upload(
        alice,
        buffer.getvalue(),
        format="npz",
        label_column=None,
        delta=1e-3,
        preparation='{"scale": {"*": {"bounds": [0, 16], "range": [-1, 1]}}}',
    )
    assert scaled.status_code == 201, scaled.text
    X, _ = _loaded(settings, database, scaled.json()["id"])
    assert X.shape == (40, 1, 4, 4) and X.min() >= -1 and X.max() <= 1 and X.min() < 0 < X.max()


def test_the_preparation_is_part_of_an_idempotent_upload(alice: TestClient) -> None:
    body = _csv(["id", "a", "label"], [[f"p{i}", i, i % 2] for i in range(20)])
    params = {"name": "d", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-3}
    headers = {"Idempotency-Key": "prep-1"}
    first = alice.post(
        "/v1/datasets", headers=headers, content=body, params=params | {"preparation": '{"drop": ["id"]}'}
    )
    assert first.status_code == 201, first.text
    same = alice.post(
        "/v1/datasets", headers=headers, content=body, params=params | {"preparation": '{ "drop" : [ "id" ] }'}
    )  # same declaration
    assert same.status_code == 200 and same.json()["id"] == first.json()["id"]
    changed = alice.post(
        "/v1/datasets",
        headers=headers,
        content=body,
        params=params | {"preparation": '{"drop": ["id"], "scale": {"a": {"bounds": [0, 20]}}}'},
    )
    assert changed.status_code == 422 and changed.json()["type"] == "/problems/idempotency-key-reused"


def test_the_preparation_is_public_and_left_out_of_listings(alice: TestClient, bob_headers: dict[str, str]) -> None:
    body = _csv(["id", "a", "label"], [[f"p{i}", i, i % 2] for i in range(20)])
    dataset = upload(alice, body, delta=1e-3, preparation='{"drop": ["id"]}').json()
    share(alice, dataset_id=dataset["id"], grantee_name="bob", grantee=bob_headers)
    analyst = alice.get(f"/v1/datasets/{dataset['id']}", headers=bob_headers).json()
    assert analyst["preparation"] == {"drop": ["id"]} and analyst["sha256"] is None
    (item,) = alice.get("/v1/datasets").json()["items"]
    assert item["id"] == dataset["id"] and item["preparation"] is None


def test_the_readme_cli_command_uploads_the_example(app_client: TestClient, database: Database, tmp_path: Path) -> None:
    """`privtrain datasets upload ... --preparation @preparation.json`, as docs/preparing-data.md shows it."""
    from click.testing import CliRunner

    from bench.breast_cancer_csv import main as write_example
    from privtrain.cli import CliEnvironment, cli
    from tests.client.conftest import BASE_URL, AppTransport
    from tests.conftest import new_key

    argv = ["breast_cancer_csv.py", "--out", str(tmp_path)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.argv", argv)
        write_example()
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": new_key(database, "hospital")}
    runner = CliRunner()

    def run(*args: str) -> object:
        return runner.invoke(cli, list(args), obj=CliEnvironment(transport=AppTransport(app_client)), env=env)

    command = [
        "datasets",
        "upload",
        str(tmp_path / "breast_cancer.csv"),
        "--label-column",
        "diagnosis",
        "--classes",
        "benign,malignant",
        "--epsilon",
        "8",
        "--delta",
        "1e-3",
    ]
    missing = run(*command, "--preparation", f"@{tmp_path / 'nope.json'}")
    assert missing.exit_code == 2  # type: ignore[attr-defined]
    shown = run(*command, "--preparation", f"@{tmp_path / 'preparation.json'}", "--json")
    assert shown.exit_code == 0, shown.stderr  # type: ignore[attr-defined]
    dataset = json.loads(shown.stdout)  # type: ignore[attr-defined]
    assert dataset["n_features"] == 30 and dataset["classes"] == ["benign", "malignant"]
    assert dataset["preparation"] == json.loads(json.dumps(preparation())) | {
        "scale": {name: {**scaling, "range": [0.0, 1.0]} for name, scaling in preparation()["scale"].items()}
    }


def test_datasets_declared_before_with_numeric_names_keep_index_labels(tmp_path: Path) -> None:
    """Before issue 14 a label was always an index into the declared list; migration 0007 keeps
    that meaning where it differs from matching by name (names that are numbers), and the worker
    then maps the labels exactly as the upload did."""
    import datetime as dt

    import sqlalchemy as sa
    from alembic import command

    from kernel.bootstrap import alembic_config
    from tests.conftest import make_settings

    settings = make_settings(tmp_path / "data")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    config = alembic_config(settings.resolved_database_url)
    command.upgrade(config, "0006")
    engine = sa.create_engine(settings.resolved_database_url)
    meta = sa.MetaData()
    tenants, datasets = (sa.Table(name, meta, autoload_with=engine) for name in ("tenants", "datasets"))
    now = dt.datetime.now(dt.UTC)
    row = {
        "tenant_id": "tn_1",
        "format": "csv",
        "sha256": "0" * 64,
        "blob_key": "k",
        "size_bytes": 1,
        "label_column": "label",
        "n_rows": 4,
        "feature_shape": [1],
        "n_features": 1,
        "task": "classification",
        "n_classes": 2,
        "created_at": now,
    }
    with engine.begin() as connection:
        connection.execute(tenants.insert().values(id="tn_1", name="old", created_at=now))
        connection.execute(
            datasets.insert(),
            [
                row | {"id": "ds_numbers", "name": "a", "class_names": ["1", "2"], "classes_declared": True},
                row | {"id": "ds_words", "name": "b", "class_names": ["no", "yes"], "classes_declared": True},
                row | {"id": "ds_observed", "name": "c", "class_names": ["0", "1"], "classes_declared": False},
            ],
        )
    engine.dispose()
    command.upgrade(config, "head")
    database = Database(settings.resolved_database_url)
    with database.read_session() as session:
        stored = {d.id: d.preparation for d in session.scalars(select(Dataset))}
    database.dispose()
    assert stored == {"ds_numbers": {"labels": "indices"}, "ds_words": None, "ds_observed": None}


def test_labels_declared_as_indices_keep_numeric_names_apart_from_labels(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    body = _csv(["a", "label"], [[i, i % 2] for i in range(20)])
    indices = '{"labels": "indices"}'
    without_list = upload(alice, body, delta=1e-3, preparation=indices)
    assert without_list.status_code == 422 and "classes=" in without_list.json()["detail"]
    by_name = upload(alice, body, delta=1e-3, classes="1,2")  # label 0 is no name
    assert by_name.status_code == 422 and by_name.json()["reason"] == "label-not-in-classes"
    declared = upload(alice, body, delta=1e-3, classes="1,2", preparation=indices)
    assert declared.status_code == 201, declared.text
    assert declared.json()["preparation"] == {"labels": "indices"}
    _, y = _loaded(settings, database, declared.json()["id"])
    np.testing.assert_array_equal(y, [i % 2 for i in range(20)])  # label 0 is the first name, "1"
