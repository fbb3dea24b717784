"""``training.ema_decay`` through the API and the worker's JobRunner: a DP-SGD job releases the
moving average of its iterates, priced exactly as without it (post-processing), recorded in the
model config and the report; algorithms that release a specific iterate refuse it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient
from safetensors import safe_open

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import CONFIG_KEY
from tests.api.test_api_public_datasets import non_private_spec, upload_public
from tests.api.worker_jobs import run_on_worker
from tests.conftest import counts, digits_split, dp_sgd_spec, to_csv, upload

DECAY = 0.999


def _model(alice: TestClient, job_id: str, tmp_path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    path = tmp_path / f"{job_id}.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        metadata = handle.metadata()
    config = json.loads(metadata[CONFIG_KEY])
    return tensors, config


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(sum(torch.sum((a[k] - b[k]) ** 2) for k in a) ** 0.5)


def test_a_dp_sgd_job_releases_the_average_at_the_same_price(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    X, X_private, y, y_private = digits_split()
    public = upload_public(alice, to_csv(X, y))
    private = upload(alice, to_csv(X_private, y_private)).json()
    start = run_on_worker(alice, settings, database, non_private_spec(public["id"]))  # known starting weights
    start_weights, _ = _model(alice, start, tmp_path)

    last_iterate = {**dp_sgd_spec(private["id"]), "model": {"name": "logistic-regression", "params": {}}}
    last_iterate["model"]["init"] = {"job_id": start}
    last_iterate["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    averaged = {**last_iterate, "training": {**last_iterate["training"], "ema_decay": DECAY}}

    plain_price = alice.post("/v1/jobs/estimate", json=last_iterate).json()
    ema_price = alice.post("/v1/jobs/estimate", json=averaged).json()
    for field in ("noise_multiplier", "sampling_probability", "steps", "epsilon_ledger", "epsilon_prv"):
        assert ema_price[field] == plain_price[field], field  # post-processing: no privacy cost

    plain_weights, plain_config = _model(alice, run_on_worker(alice, settings, database, last_iterate), tmp_path)
    ema_job = run_on_worker(alice, settings, database, averaged)
    ema_weights, ema_config = _model(alice, ema_job, tmp_path)
    assert plain_config["ema_decay"] is None and ema_config["ema_decay"] == DECAY
    # After 5 steps at d = 0.999 the start keeps weight d^5 ≈ 0.995: the average barely moves,
    # while the last iterate of the same noisy steps moves freely.
    moved = _distance(plain_weights, start_weights)
    assert moved > 0
    assert _distance(ema_weights, start_weights) < 0.05 * moved

    report = alice.get(f"/v1/jobs/{ema_job}/report").json()
    assert report["released_weights"]["method"] == "ema"
    assert report["released_weights"]["statement"] == (
        f"released weights: exponential moving average of the iterates (decay {DECAY}), "
        "post-processing: no privacy cost"
    )


def test_an_algorithm_that_releases_a_specific_iterate_refuses_it(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    dataset_id = upload(alice, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset_id)
    spec["algorithm"] = {
        "name": "kl-spider",
        "hyperparameters": {"L0": 3.0, "L1": 2.0, "gamma": 2.0, "kappa": 1.5, "F0": 1.0},
    }
    spec["training"] = {"steps": 40, "ema_decay": DECAY}
    before = counts(database)
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=spec)
        assert response.status_code == 422, response.text
        assert response.json()["detail"] == (
            "training.ema_decay: kl-spider releases the iterate its analysis bounds and does not use it; leave it out"
        )
    assert counts(database) == before
