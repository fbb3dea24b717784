"""Bring your own model: a Transformers checkpoint (a zipped ``save_pretrained`` folder) uploaded
with ``POST /v1/base-models?format=hf``, fine-tuned with DP on the same ledger, and released in
Transformers' own format. Tiny random configs built offline; the weights a job starts from are
checked to be the checkpoint's, tensor for tensor."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.test_api_hf_models import MAX_LENGTH, _upload
from tests.api.worker_jobs import run_on_worker
from tests.text_fixtures import classification_body, word_level_tokenizer_json

transformers = pytest.importorskip("transformers")

SIZES = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 24}


def _zip_folder(folder: Path, *, prefix: str = "my-model/") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, prefix + path.name)
    return buffer.getvalue()


def _saved(model: Any, tmp_path: Path, name: str, **save: Any) -> tuple[Path, bytes]:
    folder = tmp_path / name
    model.save_pretrained(folder, **save)
    return folder, _zip_folder(folder)


def _bert(dataset: dict[str, Any], *, labels: int) -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **SIZES,
        vocab_size=dataset["vocab_size"],
        pad_token_id=dataset["pad_id"],
        max_position_embeddings=64,
        num_labels=labels,
    )
    return transformers.BertForSequenceClassification(config)


def _gpt2(dataset: dict[str, Any]) -> Any:
    torch.manual_seed(1)
    config = transformers.GPT2Config(
        n_embd=16,
        n_layer=2,
        n_head=2,
        n_positions=64,
        vocab_size=dataset["vocab_size"],
        bos_token_id=None,
        eos_token_id=None,
    )
    return transformers.GPT2LMHeadModel(config)


def _post(alice: TestClient, body: bytes, **query: object) -> Any:
    return alice.post("/v1/base-models", params={"name": "mine", "format": "hf", **query}, content=body)


def _job(dataset_id: str, base_model_id: str, *, task: str, finetune: str) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "hf", "init": {"base_model_id": base_model_id}, "params": {"task": task}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5, "finetune": finetune},
    }


def test_a_bert_checkpoint_is_registered_and_fine_tuned_from_its_own_weights(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    dataset = _upload(alice, "sequence-classification")
    bert = _bert(dataset, labels=len(dataset["classes"]))
    folder, body = _saved(bert, tmp_path, "bert")
    response = _post(alice, body)
    assert response.status_code == 201, response.text
    base = response.json()
    assert base["format"] == "hf" and base["architecture"] == "hf"
    assert base["model_class"] == "BertForSequenceClassification"
    assert base["params"]["task"] == "sequence-classification"
    assert base["params"]["config"]["hidden_size"] == 16 and "architectures" not in base["params"]["config"]
    assert base["parameter_count"] == sum(p.numel() for p in bert.parameters())
    assert base["n_outputs"] == len(dataset["classes"]) and base["stored_dtypes"] == ["F32"]
    assert base["archive_sha256"] != base["sha256"]

    # finetune=head: the body is frozen, so the released body is the checkpoint's, bit for bit.
    job_id = run_on_worker(
        alice, settings, database, _job(dataset["id"], base["id"], task="sequence-classification", finetune="head")
    )
    released = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "hf"})
    assert released.status_code == 200, released.text
    with zipfile.ZipFile(io.BytesIO(released.content)) as archive:
        archive.extractall(tmp_path / "released")
    trained = load_file(str(tmp_path / "released" / "model.safetensors"))
    original = load_file(str(folder / "model.safetensors"))
    for name in ("bert.embeddings.word_embeddings.weight", "bert.encoder.layer.1.output.dense.weight"):
        torch.testing.assert_close(trained[name], original[name], rtol=0, atol=0)
    assert not torch.equal(trained["classifier.weight"], original["classifier.weight"])  # the head trained
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "released")
    assert loaded.config.num_labels == len(dataset["classes"])
    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["init"]["kind"] == "base-model" and report["init"]["base_model_id"] == base["id"]


def test_a_bare_body_needs_its_task_and_starts_every_job_with_a_new_head(alice: TestClient, tmp_path: Path) -> None:
    dataset = _upload(alice, "sequence-classification")
    body_only = _bert(dataset, labels=2).bert
    _, body = _saved(body_only, tmp_path, "body")
    unsure = _post(alice, body)
    assert unsure.status_code == 422 and "give task=" in unsure.json()["detail"]
    response = _post(alice, body, task="sequence-classification")
    assert response.status_code == 201, response.text
    assert response.json()["n_outputs"] == 0 and response.json()["model_class"] == "BertModel"


def test_refused_archives_store_nothing(alice: TestClient, settings: Settings, tmp_path: Path) -> None:
    dataset = _upload(alice, "sequence-classification")
    bert = _bert(dataset, labels=2)
    folder, _ = _saved(bert, tmp_path, "bert")
    blobs_before = sorted(p.name for p in (settings.data_dir / "blobs").rglob("*") if p.is_file())

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_bytes((folder / "config.json").read_bytes())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    refused = _post(alice, _zip_folder(pickled, prefix=""))
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/pickled-weights-refused"
    assert "safe_serialization" in refused.json()["detail"]

    assert _post(alice, b"not a zip").json()["type"] == "/problems/invalid-hf-archive"
    outside = io.BytesIO()
    with zipfile.ZipFile(outside, "w") as archive:
        archive.writestr("../config.json", "{}")
    assert _post(alice, outside.getvalue()).json()["reason"] == "member-path"

    relative = _bert(dataset, labels=2)
    relative.config.position_embedding_type = "relative_key"
    _, body = _saved(relative, tmp_path, "relative")
    unsupported = _post(alice, body)
    assert unsupported.status_code == 422 and "position_embedding_type" in unsupported.json()["detail"]

    wrong = _bert(dataset, labels=2)
    wrong.config.hidden_size = 32  # the config no longer describes the tensors
    _, body = _saved(wrong, tmp_path, "wrong")
    mismatch = _post(alice, body)
    assert mismatch.status_code == 422 and mismatch.json()["type"] == "/problems/base-model-shape-mismatch"

    given = _post(alice, _zip_folder(folder), architecture="mlp")
    assert given.status_code == 422 and "leave them out" in given.json()["detail"]

    assert alice.get("/v1/base-models").json()["items"] == []
    assert sorted(p.name for p in (settings.data_dir / "blobs").rglob("*") if p.is_file()) == blobs_before


def _with_tokenizer(tmp_path: Path, *, vocab_size: int, pad: int = 6) -> bytes:
    """A BERT whose checkpoint folder holds its tokenizer (word level, [PAD] the last of 7 ids)."""
    torch.manual_seed(2)
    config = transformers.BertConfig(
        **SIZES, vocab_size=vocab_size, pad_token_id=pad, max_position_embeddings=64, num_labels=2
    )
    folder = tmp_path / f"bert-{vocab_size}"
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(word_level_tokenizer_json())
    (folder / "tokenizer_config.json").write_text('{"pad_token": "[PAD]", "model_max_length": 64}')
    return _zip_folder(folder)


def test_the_checkpoints_tokenizer_is_registered_and_tokenises_datasets_for_it(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    response = _post(alice, _with_tokenizer(tmp_path, vocab_size=7))
    assert response.status_code == 201, response.text
    base = response.json()
    tokenizer = alice.get(f"/v1/tokenizers/{base['tokenizer_id']}").json()
    assert tokenizer["vocab_size"] == 7 and tokenizer["pad_id"] == 6 and tokenizer["kind"] == "uploaded"

    query = {"name": "films", "format": "jsonl", "max_length": MAX_LENGTH, "epsilon": 8, "delta": 1e-3}
    dataset = alice.post(
        "/v1/datasets", params={**query, "tokenizer": f"base:{base['id']}"}, content=classification_body()
    )
    assert dataset.status_code == 201, dataset.text
    assert dataset.json()["tokenizer_id"] == base["tokenizer_id"] and dataset.json()["pad_id"] == 6
    job_id = run_on_worker(
        alice,
        settings,
        database,
        _job(dataset.json()["id"], base["id"], task="sequence-classification", finetune="head"),
    )
    assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"

    unknown = alice.post("/v1/datasets", params={**query, "tokenizer": "base:bm_nope"}, content=classification_body(3))
    assert unknown.status_code == 422 and unknown.json()["type"] == "/problems/unknown-tokenizer"


def test_a_tokenizer_that_is_not_the_models_refuses_the_upload_and_stores_nothing(
    alice: TestClient, tmp_path: Path
) -> None:
    refused = _post(alice, _with_tokenizer(tmp_path, vocab_size=6, pad=5))  # 7 token ids for 6 embedding rows
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/base-model-tokenizer-mismatch"
    assert alice.get("/v1/base-models").json()["items"] == []
    assert alice.get("/v1/tokenizers").json()["items"] == [
        t for t in alice.get("/v1/tokenizers").json()["items"] if t["kind"] == "built-in"
    ]
