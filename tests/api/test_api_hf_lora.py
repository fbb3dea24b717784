"""LoRA through PEFT on an uploaded Transformers checkpoint, end to end through the API: the job
trains PEFT's adapters on the worker; the model downloads as a PEFT adapter that
``PeftModel.from_pretrained(base, folder)`` loads onto the uploaded checkpoint, as a merged
Transformers folder, and as the service's own file, and all three compute the same function."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from tests.api.test_api_hf_base_models import _gpt2, _job, _post, _saved
from tests.api.test_api_hf_models import _upload
from tests.api.worker_jobs import run_on_worker

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def _unzipped(alice: TestClient, job_id: str, fmt: str, into: Path) -> Path:
    response = alice.get(f"/v1/jobs/{job_id}/model", params={"format": fmt})
    assert response.status_code == 200, response.text
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        archive.extractall(into)
    return into


def _service_logits(alice: TestClient, job_id: str, ids: torch.Tensor, tmp_path: Path) -> torch.Tensor:
    released = alice.get(f"/v1/jobs/{job_id}/model")
    assert released.status_code == 200
    path = tmp_path / f"{job_id}.safetensors"
    path.write_bytes(released.content)
    model, _ = load_model(path)
    with torch.no_grad():
        return model(ids)


def _lora_job(dataset_id: str, base_id: str, *, task: str, **lora: object) -> dict[str, Any]:
    spec = _job(dataset_id, base_id, task=task, finetune="lora")
    spec["training"]["lora"] = {"rank": 2, "alpha": 4, **lora}
    return spec


def test_a_sharded_gpt2_checkpoint_trains_lora_and_downloads_as_a_peft_adapter_and_merged(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    """Also: a sharded checkpoint whose head is tied (saved once), and a classifier started from it."""
    lm_data = _upload(alice, "causal-lm")
    folder, body = _saved(_gpt2(lm_data), tmp_path, "gpt2", max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").exists()  # sharded, and the head saved once (tied)
    created = _post(alice, body)
    assert created.status_code == 201, created.text
    base = created.json()
    assert base["model_class"] == "GPT2LMHeadModel" and base["params"]["task"] == "causal-lm"
    assert base["n_outputs"] == lm_data["vocab_size"]

    hf = next(item for item in alice.get("/v1/models").json()["items"] if item["name"] == "hf")
    assert hf["lora"] is True and hf["lora_targets"]["gpt2"] == {
        "default": ["c_attn"],
        "accepted": ["c_attn", "c_fc", "c_proj"],
    }

    # Refused before anything is reserved: a layer GPT-2 has not, and a LoRA dropout.
    refused = alice.post("/v1/jobs", json=_lora_job(lm_data["id"], base["id"], task="causal-lm", target_modules=["q"]))
    assert refused.status_code == 422 and refused.json()["type"].endswith("/lora-unsupported-model"), refused.text
    assert "c_attn" in refused.json()["detail"]
    dropout = alice.post("/v1/jobs", json=_lora_job(lm_data["id"], base["id"], task="causal-lm", dropout=0.1))
    assert dropout.status_code == 422 and "dropout" in dropout.text

    job_id = run_on_worker(alice, settings, database, _lora_job(lm_data["id"], base["id"], task="causal-lm"))
    adapter_dir = _unzipped(alice, job_id, "peft", tmp_path / "adapter")
    assert sorted(p.name for p in adapter_dir.iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "privacy_report.json",
    ]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert config["r"] == 2 and config["target_modules"] == ["c_attn"] and config["task_type"] == "CAUSAL_LM"
    report = json.loads((adapter_dir / "privacy_report.json").read_text())
    assert report["init"]["archive_sha256"] == base["archive_sha256"]  # the base the adapter goes on
    assert base["archive_sha256"] in (adapter_dir / "README.md").read_text()

    ids = torch.randint(
        lm_data["pad_id"] + 1, lm_data["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0)
    )
    expected = _service_logits(alice, job_id, ids, tmp_path)
    on_base = peft.PeftModel.from_pretrained(transformers.GPT2LMHeadModel.from_pretrained(folder), adapter_dir).eval()
    merged_dir = _unzipped(alice, job_id, "hf", tmp_path / "merged")
    assert not any("lora" in name or "adapter" in name for name in load_file(str(merged_dir / "model.safetensors")))
    merged = transformers.GPT2LMHeadModel.from_pretrained(merged_dir).eval()
    plain = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        torch.testing.assert_close(on_base(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-5)  # the adapters trained

    # A classifier from the language model: PEFT trains its new head with the adapters.
    classes = _upload(alice, "sequence-classification")
    spec = _lora_job(classes["id"], base["id"], task="sequence-classification", target_modules=["c_attn", "c_fc"])
    classifier_job = run_on_worker(alice, settings, database, spec)
    assert (
        alice.get(f"/v1/jobs/{classifier_job}").json()["spec"]["model"]["params"]["task"] == "sequence-classification"
    )
    assert alice.get(f"/v1/jobs/{classifier_job}/report").json()["init"]["new_head"] is True  # a new head on the body
    head_dir = _unzipped(alice, classifier_job, "peft", tmp_path / "head")
    head_config = json.loads((head_dir / "adapter_config.json").read_text())
    assert head_config["target_modules"] == ["c_attn", "c_fc"] and "score" in head_config["modules_to_save"]
    labels = len(classes["classes"])
    body_base = transformers.GPT2ForSequenceClassification.from_pretrained(folder, num_labels=labels)
    body_base.config.pad_token_id = classes["pad_id"]
    classifier = peft.PeftModel.from_pretrained(body_base, head_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(
            classifier(input_ids=ids).logits,
            _service_logits(alice, classifier_job, ids, tmp_path),
            rtol=1e-4,
            atol=1e-5,
        )
