"""POST/GET/DELETE /v1/base-models: safetensors weights validated against a zoo architecture
without unpickling (names, dtypes, shapes), stored by content hash, tenant-scoped, idempotent, and
usable as a job's ``model.init`` (docs/pretraining-and-finetuning.md)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.zoo.architectures import build_model
from tests.conftest import upload
from worker.runner import JobRunner

QUERY = {
    "name": "tiny-mlp",
    "architecture": "mlp",
    "params": '{"hidden_sizes": [16]}',
    "input_shape": "64",
    "n_outputs": 10,
}


def tiny_mlp_bytes(*, hidden: int = 16, dtype: torch.dtype = torch.float32, rename: bool = False) -> bytes:
    model = build_model("mlp", {"hidden_sizes": [hidden]}, input_shape=(64,), n_outputs=10)
    tensors = {("x" + k if rename else k): v.to(dtype).contiguous() for k, v in model.state_dict().items()}
    return save(tensors)


def post(client: TestClient, body: bytes, **overrides: object) -> object:
    return client.post("/v1/base-models", params={**QUERY, **overrides}, content=body)


def _type(response: object) -> str:
    return response.json()["type"].rsplit("/", 1)[-1]  # type: ignore[attr-defined]


def _blob_files(settings: Settings) -> set[Path]:
    return {p for p in settings.blob_dir.rglob("*") if p.is_file()}


def test_upload_list_show_and_idempotency(alice: TestClient, bob_headers: dict[str, str]) -> None:
    body = tiny_mlp_bytes()
    created = post(alice, body, source="made in a test")
    assert created.status_code == 201, created.text  # type: ignore[attr-defined]
    out = created.json()  # type: ignore[attr-defined]
    assert out["id"].startswith("bm_") and out["sha256"] == hashlib.sha256(body).hexdigest()
    assert out["params"] == {"hidden_sizes": [16], "activation": "tanh"} and out["source"] == "made in a test"
    assert alice.get(f"/v1/base-models/{out['id']}").json() == out
    assert [item["id"] for item in alice.get("/v1/base-models").json()["items"]] == [out["id"]]
    assert alice.get(f"/v1/base-models/{out['id']}", headers=bob_headers).status_code == 404  # tenant-scoped
    assert alice.get("/v1/base-models", headers=bob_headers).json()["items"] == []

    keyed = alice.post("/v1/base-models", params=QUERY, content=body, headers={"Idempotency-Key": "k1"})
    again = alice.post("/v1/base-models", params=QUERY, content=body, headers={"Idempotency-Key": "k1"})
    assert keyed.status_code == 201 and again.status_code == 200 and again.json()["id"] == keyed.json()["id"]
    other = alice.post(
        "/v1/base-models", params={**QUERY, "name": "other"}, content=body, headers={"Idempotency-Key": "k1"}
    )
    assert other.status_code == 422 and _type(other) == "idempotency-key-reused"


def test_refusals_have_stable_types_and_store_nothing(alice: TestClient, settings: Settings) -> None:
    before = _blob_files(settings)
    cases = [
        (tiny_mlp_bytes(hidden=8), {}, "base-model-shape-mismatch"),
        (tiny_mlp_bytes(rename=True), {}, "base-model-names-mismatch"),
        (tiny_mlp_bytes(dtype=torch.int32), {}, "base-model-dtype-mismatch"),  # any float fits, never ints
        (b"\x80\x04\x95 a pickle, never unpickled", {}, "invalid-safetensors"),
        (tiny_mlp_bytes()[:-4], {}, "invalid-safetensors"),
        (tiny_mlp_bytes(), {"architecture": "resnet-9000"}, "unknown-model"),
        (tiny_mlp_bytes(), {"params": "[1]"}, "invalid-base-model-request"),
        (tiny_mlp_bytes(), {"params": '{"depth": 3}'}, "model-incompatible"),
        (tiny_mlp_bytes(), {"input_shape": "0"}, "invalid-base-model-request"),
        (tiny_mlp_bytes(), {"n_outputs": 3}, "base-model-shape-mismatch"),
    ]
    for body, overrides, expected in cases:
        refused = post(alice, body, **overrides)
        assert refused.status_code == 422, (expected, refused.text)  # type: ignore[attr-defined]
        assert _type(refused) == expected, refused.json()  # type: ignore[attr-defined]
    names = post(alice, tiny_mlp_bytes(rename=True)).json()  # type: ignore[attr-defined]
    assert "1.weight" in names["missing"] and "x1.weight" in names["unexpected"]
    assert alice.get("/v1/base-models").json()["items"] == []
    assert _blob_files(settings) == before  # nothing left behind


def test_base_model_as_init_and_delete_rules(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    base = post(alice, tiny_mlp_bytes(), source="a test").json()  # type: ignore[attr-defined]
    dataset = upload(alice, digits_csv).json()  # type: ignore[attr-defined]
    spec = {
        "dataset_id": dataset["id"],
        "model": {"name": "mlp", "params": {"hidden_sizes": [16]}, "init": {"base_model_id": base["id"]}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
        "privacy": {"target_epsilon": 4.0},
        "training": {"steps": 5, "batch_size": 64, "learning_rate": 0.5},
    }
    job_id = alice.post("/v1/jobs", json=spec).json()["id"]
    busy = alice.delete(f"/v1/base-models/{base['id']}")
    assert busy.status_code == 409 and _type(busy) == "base-model-in-use" and busy.json()["job_ids"] == [job_id]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"
    init = alice.get(f"/v1/jobs/{job_id}/report").json()["init"]
    assert init["kind"] == "base-model" and init["sha256"] == base["sha256"] and init["source"] == "a test"
    assert "treated as public" in init["statement"] and base["id"] in init["statement"]
    assert alice.delete(f"/v1/base-models/{base['id']}").status_code == 204
    assert alice.get(f"/v1/base-models/{base['id']}").status_code == 404
    gone = alice.post("/v1/jobs", json=spec)
    assert gone.status_code == 404


def test_an_api_host_without_torch_says_it_cannot_check_weights(
    alice: TestClient, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API image has no torch: the weight check's child process then cannot build the
    architecture, and the upload is a 503 naming the missing component (not a 422 blaming the
    weights), storing nothing."""
    blocked = tmp_path / "no_torch" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text('raise ImportError("torch is blocked in this test")\n')
    monkeypatch.setenv("PYTHONPATH", str(blocked.parent))
    before = _blob_files(settings)
    refused = post(alice, tiny_mlp_bytes())
    assert refused.status_code == 503, refused.text  # type: ignore[attr-defined]
    assert _type(refused) == "base-model-check-unavailable"
    assert "torch" in refused.json()["detail"]  # type: ignore[attr-defined]
    assert alice.get("/v1/base-models").json()["items"] == []
    assert _blob_files(settings) == before


def test_a_text_model_uploads_as_a_base_model(alice: TestClient) -> None:
    """A transformer's weights (its vocabulary in its params) are checked against the architecture
    the worker would build, like any zoo model's."""
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 259, "pad_id": 256}
    model = build_model("transformer-lm", params, input_shape=(16,), n_outputs=259)
    body = save({k: v.contiguous() for k, v in model.state_dict().items()})
    query = {"name": "tiny-lm", "architecture": "transformer-lm", "input_shape": "16", "n_outputs": 259}
    created = post(alice, body, **query, params=json.dumps(params))
    assert created.status_code == 201, created.text  # type: ignore[attr-defined]
    assert created.json()["architecture"] == "transformer-lm"  # type: ignore[attr-defined]
    other_vocabulary = post(alice, body, **query, params=json.dumps({**params, "vocab_size": 300}))
    assert other_vocabulary.status_code == 422  # type: ignore[attr-defined]
