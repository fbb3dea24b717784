"""`hf` models (Transformers from a config) end to end through the API and the in-process worker:
upload a text dataset, train with DP-SGD, download the released model and load it with
`privtrain.load_model`. Tiny configs, a handful of steps; every allow-listed model type."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import privtrain
from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.worker_jobs import run_on_worker
from tests.text_fixtures import classification_body, language_model_body
from tests.unit.worker.hf_fixtures import HF_CASES, hf_config

MAX_LENGTH = 16


def _upload(alice: TestClient, task: str) -> dict[str, Any]:
    body = language_model_body() if task == "causal-lm" else classification_body()
    query: dict[str, object] = {"name": "notes", "format": "jsonl", "max_length": MAX_LENGTH, "epsilon": 8}
    if task == "causal-lm":
        query["task"] = "language-model"
    response = alice.post("/v1/datasets", params={**query, "delta": 1e-3}, content=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def hf_spec(dataset_id: str, model_type: str, task: str) -> dict[str, Any]:
    """A DP-SGD job on a tiny `hf` model with room for the rows (RoBERTa counts positions after the pad id)."""
    return {
        "dataset_id": dataset_id,
        "model": {"name": "hf", "params": {"task": task, "config": hf_config(model_type, positions=MAX_LENGTH + 300)}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5},
    }


def released(alice: TestClient, job_id: str, tmp_path: Path) -> privtrain.LoadedModel:
    response = alice.get(f"/v1/jobs/{job_id}/model")
    assert response.status_code == 200, response.text
    path = tmp_path / f"{job_id}.safetensors"
    path.write_bytes(response.content)
    return privtrain.load_model(path)


E2E_CASES = [(t, k) for t, k in HF_CASES if k != "causal-lm" or t == "gpt2"]
"""Every family end to end as a classifier, and one as a language model (Llama's and Qwen2's
language models differ from their classifiers only in the head: tests/unit/worker covers them)."""


@pytest.mark.parametrize(("model_type", "task"), E2E_CASES, ids=[f"{t}-{k}" for t, k in E2E_CASES])
def test_an_hf_model_trains_with_dp_sgd_and_loads_with_privtrain(
    model_type: str, task: str, alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    dataset = _upload(alice, task)
    job_id = run_on_worker(alice, settings, database, hf_spec(dataset["id"], model_type, task))
    job = alice.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded"
    model, config = released(alice, job_id, tmp_path)
    hf = config["model"]["params"]["config"]
    assert hf["vocab_size"] == dataset["vocab_size"] and hf["pad_token_id"] == dataset["pad_id"]  # the dataset's
    ids = torch.full((3, MAX_LENGTH), dataset["pad_id"])
    ids[:, :5] = torch.tensor([72, 105, 33, 10, 101])
    with torch.no_grad():
        out = model(ids)
    width = dataset["vocab_size"] if task == "causal-lm" else len(config["classes"])
    assert out.shape == ((3, MAX_LENGTH, width) if task == "causal-lm" else (3, width))
    assert torch.isfinite(out).all()
    _assert_transformers_loads_the_same_model(alice, job_id, task, ids, out, dataset, tmp_path)
    if task == "causal-lm":  # the Transformers model's own generate, in the capped child
        answer = alice.post(f"/v1/jobs/{job_id}/generate", json={"prompt": "hi", "max_tokens": 3, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert 0 <= answer.json()["tokens_generated"] <= 3 and isinstance(answer.json()["text"], str)


def _assert_transformers_loads_the_same_model(
    alice: TestClient,
    job_id: str,
    task: str,
    ids: torch.Tensor,
    expected: torch.Tensor,
    dataset: dict[str, Any],
    tmp_path: Path,
) -> None:
    """format=hf: a save_pretrained folder that Transformers loads into the model the service released."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification  # heavy: these tests only

    response = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "hf"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    no_adapter = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "peft"})  # not a LoRA job
    assert no_adapter.status_code == 422 and no_adapter.json()["type"] == "/problems/model-format-unavailable"
    assert "finetune lora" in no_adapter.json()["detail"]
    folder = tmp_path / "hf"
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        assert sorted(archive.namelist()) == ["README.md", "config.json", "model.safetensors", "privacy_report.json"]
        archive.extractall(folder)
    report = json.loads((folder / "privacy_report.json").read_text())
    assert report["job_id"] == job_id and report["guarantee"] in (folder / "README.md").read_text()
    auto = AutoModelForCausalLM if task == "causal-lm" else AutoModelForSequenceClassification
    model = auto.from_pretrained(folder, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=(ids != dataset["pad_id"]).long()).logits
    real = ids != dataset["pad_id"]
    if task == "causal-lm":
        torch.testing.assert_close(got[real], expected[real])
    else:
        torch.testing.assert_close(got, expected)
        assert model.config.id2label == dict(enumerate(dataset["classes"]))


def test_format_hf_of_a_zoo_model_is_a_problem(alice: TestClient, settings: Settings, database: Database) -> None:
    dataset = _upload(alice, "sequence-classification")
    spec = {
        **hf_spec(dataset["id"], "bert", "sequence-classification"),
        "model": {"name": "transformer-classifier", "params": {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8}},
    }
    job_id = run_on_worker(alice, settings, database, spec)
    refused = alice.get(f"/v1/jobs/{job_id}/model", params={"format": "hf"})
    assert refused.status_code == 422 and refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["type"] == "/problems/model-format-unavailable"
    assert "'transformer-classifier'" in refused.json()["detail"]
    assert alice.get(f"/v1/jobs/{job_id}/model", params={"format": "onnx"}).status_code == 422
    assert alice.get(f"/v1/jobs/{job_id}/model").status_code == 200


def test_configs_that_do_not_fit_are_refused_at_estimate_with_the_reason(alice: TestClient) -> None:
    dataset = _upload(alice, "sequence-classification")

    def refusal(config: dict[str, Any], task: str = "sequence-classification") -> str:
        spec = hf_spec(dataset["id"], "bert", task)
        spec["model"]["params"]["config"] = config
        response = alice.post("/v1/jobs/estimate", json=spec)
        assert response.status_code == 422, response.text
        assert response.headers["content-type"] == "application/problem+json"
        return str(response.json()["detail"])

    config = hf_config("bert", positions=MAX_LENGTH)
    assert "supported: bert, convnext, distilbert, gpt2, llama, qwen2, roberta, vit" in refusal(
        {**config, "model_type": "t5"}
    )
    assert "['auto_map'] are not accepted" in refusal({**config, "auto_map": {"AutoModel": "evil.Model"}})
    small = dataset["vocab_size"] - 1
    assert f"tokenizer has {dataset['vocab_size']} token ids" in refusal({**config, "vocab_size": small})
    assert "trains on a language-model dataset" in refusal(hf_config("gpt2", positions=MAX_LENGTH), "causal-lm")


def test_last_k_blocks_trains_only_the_last_layer_and_the_head(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    dataset = _upload(alice, "sequence-classification")
    spec = hf_spec(dataset["id"], "llama", "sequence-classification")
    first = run_on_worker(alice, settings, database, spec)
    tuned_spec = {
        **spec,
        "model": {**spec["model"], "init": {"job_id": first}},
        "training": {**spec["training"], "finetune": "last_k_blocks", "finetune_k": 2},
    }
    tuned = run_on_worker(alice, settings, database, tuned_spec)
    before, _ = released(alice, first, tmp_path)
    after, _ = released(alice, tuned, tmp_path)
    old, new = before.state_dict(), after.state_dict()
    changed = {name for name in old if not torch.equal(old[name], new[name])}
    kept = ("model.model.layers.1.", "model.model.norm.", "model.score.")  # layer2 and the head (llama's blocks)
    assert changed and all(name.startswith(kept) for name in changed)
