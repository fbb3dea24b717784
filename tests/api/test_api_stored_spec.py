"""Every spec shape the service stores parses into the typed view (kernel/schemas/stored_spec.py)
and comes back unchanged: the same keys, in the same order, with the same JSON types. Each shape
is made the way a client makes it (through the API, and the worker where a shape needs a run): a
plain job, one with a DP evaluation, a start from a base model, public pretraining then a private
fine-tuning (init chain), LoRA, and a tuning when admitted and once it released its best trial."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.schemas.stored_spec import BaseModelStart, JobStart, StoredJobSpec, parse_stored_spec, stored_spec
from tests.api.test_api_base_models import post as post_base_model
from tests.api.test_api_base_models import tiny_mlp_bytes
from tests.api.test_api_public_datasets import upload_public
from tests.api.worker_jobs import run_on_worker
from tests.conftest import digits_split, to_csv, upload
from tests.text_fixtures import language_model_body
from tests.tuning_run import run_tuning, tuning_request, tuning_settings

DP_SGD = {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}}
TRAINING = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return tuning_settings(tmp_path / "data")


def _stored(database: Database, job_id: str) -> tuple[dict[str, Any], StoredJobSpec]:
    """The row's spec as loaded from the database, and its typed view."""
    with database.read_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.spec, stored_spec(job)


def _round_trips(raw: dict[str, Any], view: StoredJobSpec) -> None:
    back = view.to_json()
    assert back == raw
    assert json.dumps(back) == json.dumps(raw)  # key order and int/float kept too
    assert parse_stored_spec(back) == view


def _submit(alice: TestClient, spec: dict[str, Any]) -> str:
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_plain_and_evaluated_jobs_round_trip(alice: TestClient, database: Database, digits_csv: bytes) -> None:
    dataset = upload(alice, digits_csv).json()["id"]  # type: ignore[attr-defined]
    plain = {
        "dataset_id": dataset,
        "model": {"name": "mlp", "params": {"hidden_sizes": [8]}},
        "algorithm": DP_SGD,
        "privacy": {"target_epsilon": 2.0},
        "training": TRAINING,
    }
    evaluated = {
        **plain,
        "privacy": {"noise_multiplier": 1.1, "delta": 1e-6},
        "evaluation": {"holdout_fraction": 0.2, "mechanism": "gaussian", "noise_multiplier": 2.0},
        "resources": {"queue": None},
    }
    raw, view = _stored(database, _submit(alice, plain))
    _round_trips(raw, view)
    assert view.init is None and view.tuning is None and view.evaluation is None and not view.is_tuning
    assert view.model.params["hidden_sizes"] == [8] and view.training.steps == 5
    assert view.privacy is not None and view.privacy.delta == 1e-5  # the dataset's δ, filled in
    raw, view = _stored(database, _submit(alice, evaluated))
    _round_trips(raw, view)
    assert view.evaluation is not None and view.evaluation.mechanism == "gaussian"
    assert view.evaluation.validated().holdout_fraction == 0.2


def test_starts_from_a_base_model_and_from_public_pretraining_round_trip(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    private = upload(alice, digits_csv).json()["id"]  # type: ignore[attr-defined]
    _, X_test, _, y_test = digits_split()
    public = upload_public(alice, to_csv(X_test, y_test))["id"]  # other rows: the same ones register once
    base = post_base_model(alice, tiny_mlp_bytes(), source="a test").json()  # type: ignore[attr-defined]
    mlp = {"name": "mlp", "params": {"hidden_sizes": [16]}}
    from_base = {
        "dataset_id": private,
        "model": {**mlp, "init": {"base_model_id": base["id"]}},
        "algorithm": DP_SGD,
        "privacy": {"target_epsilon": 4.0},
        "training": {**TRAINING, "finetune": "head"},
    }
    raw, view = _stored(database, _submit(alice, from_base))
    _round_trips(raw, view)
    assert isinstance(view.init, BaseModelStart) and view.init.base_model_id == base["id"]
    assert view.init.stored_dtypes == ["F32"] and view.init.new_head is False

    pretrained = run_on_worker(
        alice,
        settings,
        database,
        {"dataset_id": public, "model": mlp, "algorithm": {"name": "adam"}, "training": TRAINING},
    )
    raw, view = _stored(database, pretrained)
    _round_trips(raw, view)
    assert view.privacy is None  # a non-private optimizer
    fine_tuned = {**from_base, "model": {**mlp, "init": {"job_id": pretrained}}, "training": TRAINING}
    raw, view = _stored(database, _submit(alice, fine_tuned))
    _round_trips(raw, view)
    assert isinstance(view.init, JobStart) and view.init.job_id == pretrained and view.init.dataset_public
    assert view.init.chain is not None and [link.data for link in view.init.chain.links] == ["public-dataset"]
    assert view.init.chain.origin.kind == "fresh"


def test_lora_fine_tuning_round_trips(alice: TestClient, settings: Settings, database: Database) -> None:
    query: dict[str, object] = {"name": "notes", "format": "jsonl", "max_length": 16, "task": "language-model"}
    public = alice.post("/v1/datasets", params={**query, "public": "true"}, content=language_model_body()).json()
    private = alice.post(
        "/v1/datasets", params={**query, "epsilon": 8, "delta": 1e-3}, content=language_model_body(repeat=6)
    ).json()
    sizes = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16}
    pretrained = run_on_worker(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": {"name": "transformer-lm", "params": sizes},
            "algorithm": {"name": "adam"},
            "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.01},
        },
    )
    lora = {
        "dataset_id": private["id"],
        "model": {"name": "transformer-lm", "params": sizes, "init": {"job_id": pretrained}},
        "algorithm": DP_SGD,
        "privacy": {"noise_multiplier": 1.0},
        "training": {
            "steps": 3,
            "batch_size": 8,
            "learning_rate": 0.5,
            "finetune": "lora",
            "lora": {"rank": 2, "alpha": 4},
            "token_loss": "sum",
        },
        "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5},
    }
    raw, view = _stored(database, _submit(alice, lora))
    _round_trips(raw, view)
    assert view.training.lora is not None and (view.training.lora.rank, view.training.lora.alpha) == (2, 4.0)
    assert view.evaluation is not None and view.evaluation.loss_clip is None
    assert view.model.params["vocab_size"] == private["vocab_size"]  # filled from the dataset


def test_a_tuning_round_trips_when_admitted_and_once_it_released_its_best_trial(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    dataset = upload(alice, digits_csv).json()["id"]  # type: ignore[attr-defined]
    body = alice.post("/v1/tuning-jobs", json=tuning_request(dataset)).json()
    raw, view = _stored(database, body["job_id"])
    _round_trips(raw, view)
    assert view.tuning is not None and view.is_tuning and view.tuning.selected is None
    assert view.tuning.schedule is not None and view.tuning.schedule.slots == 3
    assert view.tuning.trials.maximum == 3 and view.tuning.selection.goal == "max"
    assert len(view.tuning.candidates) == 6 and all(c.spec.tuning is None for c in view.tuning.candidates)
    assert view.to_json(exclude={"tuning"}) == view.tuning.candidates[0].spec.to_json()  # the carrier is candidate 0

    assert run_tuning(settings, database, body["job_id"]) == "succeeded"
    raw, released = _stored(database, body["job_id"])
    _round_trips(raw, released)
    assert released.tuning is not None and released.tuning.selected is not None
    chosen = next(c for c in view.tuning.candidates if c.assignment == released.tuning.selected)
    assert released.to_json() == view.released_trial(chosen).to_json()  # what the closer wrote: the typed write-back
    assert released.tuning.to_json(exclude={"selected"}) == view.tuning.to_json()
