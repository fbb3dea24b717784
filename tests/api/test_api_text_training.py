"""Text training end to end through the API and the in-process worker: public pretraining of a
transformer-lm with adam, then DP LoRA fine-tuning from it on a private text dataset; the released
model is merged, loads with `load_model`, and records its LoRA settings. A text classifier trains
with dicesgd. Tiny models, a handful of steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from tests.api.worker_jobs import run_on_worker
from tests.text_fixtures import classification_body, language_model_body

SIZES = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16}


def _upload(alice: TestClient, body: bytes, **params: object) -> dict[str, Any]:
    query: dict[str, object] = {"name": "notes", "format": "jsonl", "max_length": 16, **params}
    response = alice.post("/v1/datasets", params=query, content=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _downloaded(alice: TestClient, job_id: str, tmp_path: Path) -> Any:
    path = tmp_path / f"{job_id}.safetensors"
    response = alice.get(f"/v1/jobs/{job_id}/model")
    assert response.status_code == 200, response.text
    path.write_bytes(response.content)
    return load_model(path)


def test_public_pretraining_then_private_lora_fine_tuning(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    public = _upload(alice, language_model_body(), public="true", task="language-model")
    private = _upload(alice, language_model_body(repeat=6), epsilon=8, delta=1e-3, task="language-model")
    pretrained = run_on_worker(
        alice,
        settings,
        database,
        {
            "dataset_id": public["id"],
            "model": {"name": "transformer-lm", "params": SIZES},
            "algorithm": {"name": "adam"},
            "training": {"steps": 5, "batch_size": 8, "learning_rate": 0.01},
        },
    )
    base, base_config = _downloaded(alice, pretrained, tmp_path)
    assert base_config["task"] == "language-model" and base_config["lora"] is None
    assert base_config["model"]["params"]["vocab_size"] == public["vocab_size"]  # filled from the dataset
    assert base_config["text"] == {  # what a user needs to tokenise inputs for the released model
        "tokenizer_id": public["tokenizer_id"],
        "vocab_size": public["vocab_size"],
        "pad_id": public["pad_id"],
        "max_length": public["max_length"],
    }

    fine_tuned = run_on_worker(
        alice,
        settings,
        database,
        {
            "dataset_id": private["id"],
            "model": {"name": "transformer-lm", "params": SIZES, "init": {"job_id": pretrained}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"noise_multiplier": 1.0},
            "training": {
                "steps": 3,
                "batch_size": 8,
                "learning_rate": 0.5,
                "finetune": "lora",
                "lora": {"rank": 2, "alpha": 4},
                "token_loss": "sum",
            },
        },
    )
    model, config = _downloaded(alice, fine_tuned, tmp_path)
    assert config["lora"] == {"rank": 2, "alpha": 4.0, "merged": True}
    base_state, tuned_state = base.state_dict(), model.state_dict()
    assert list(tuned_state) == list(base_state)  # the plain architecture: no adapter tensors
    changed = {name for name in base_state if not torch.equal(base_state[name], tuned_state[name])}
    adapted = ("attention.q.", "attention.k.", "attention.v.", "attention.out.", "mlp.")
    # Only Linear weights the adapters merge into moved; biases, norms and embeddings are the base's.
    assert changed and all(name.endswith("weight") and any(part in name for part in adapted) for name in changed)
    tokens = torch.full((2, 16), private["pad_id"])
    tokens[:, :4] = torch.tensor([72, 105, 33, 10])
    assert model(tokens).shape == (2, 16, private["vocab_size"])

    # A classifier starts from the language model: its body reused, a new head (finetune head: the
    # body stays the LM's, bit for bit).
    reviews = _upload(alice, classification_body(), epsilon=8, delta=1e-3, name="reviews")
    classifier = run_on_worker(
        alice,
        settings,
        database,
        {
            "dataset_id": reviews["id"],
            "model": {"name": "transformer-classifier", "params": SIZES, "init": {"job_id": pretrained}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"noise_multiplier": 1.0},
            "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5, "finetune": "head"},
        },
    )
    head_tuned, _ = _downloaded(alice, classifier, tmp_path)
    for name in ("embedding.weight", "blocks.0.attention.q.weight", "blocks.0.mlp.0.weight"):
        assert torch.equal(head_tuned.state_dict()[name], base_state[name]), name
    assert alice.get(f"/v1/jobs/{classifier}/report").json()["init"]["new_head"] is True
    other = alice.post(
        "/v1/jobs/estimate",
        json={
            "dataset_id": reviews["id"],
            "model": {"name": "transformer-classifier", "params": {**SIZES, "dim": 16}, "init": {"job_id": pretrained}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"noise_multiplier": 1.0},
            "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.5, "finetune": "head"},
        },
    )
    assert other.status_code == 422 and "differ from the init's" in other.json()["detail"]


def test_a_text_classifier_trains_with_dicesgd_and_an_lm_evaluation_refuses_error_clip(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    reviews = _upload(alice, classification_body(), epsilon=8, delta=1e-3)
    job = run_on_worker(
        alice,
        settings,
        database,
        {
            "dataset_id": reviews["id"],
            "model": {"name": "transformer-classifier", "params": {**SIZES, "pooling": "first"}},
            "algorithm": {"name": "dicesgd"},
            "privacy": {"noise_multiplier": 2.0},
            "training": {"steps": 3, "batch_size": 8, "learning_rate": 0.1},
        },
    )
    model, config = _downloaded(alice, job, tmp_path)
    assert config["classes"] == ["bad", "good"] and config["model"]["params"]["pad_id"] == reviews["pad_id"]
    assert model(torch.full((3, 16), reviews["pad_id"])).shape == (3, 2)

    lm = _upload(alice, language_model_body(), epsilon=8, delta=1e-3, task="language-model", name="lm")
    refused = alice.post(
        "/v1/jobs/estimate",
        json={
            "dataset_id": lm["id"],
            "model": {"name": "transformer-lm", "params": SIZES},
            "algorithm": {"name": "dp-sgd"},
            "privacy": {"noise_multiplier": 1.0},
            "training": {"steps": 3, "batch_size": 8, "learning_rate": 0.1},
            "evaluation": {"holdout_fraction": 0.2, "epsilon": 1.0, "error_clip": 1.0},
        },
    )
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/invalid-job-spec"
    assert "evaluation.error_clip applies to regression datasets" in refused.json()["detail"]


def test_text_jobs_that_cannot_train_are_refused_at_estimate_and_submission(
    alice: TestClient, database: Database
) -> None:
    """Token ids are names, not magnitudes: numeric-feature models refuse them; the heavy-tailed
    family trains one linear layer only, so it refuses a transformer before any reservation."""
    reviews = _upload(alice, classification_body(), epsilon=8, delta=1e-3)
    cases = [
        ("logistic-regression", "dp-sgd", "reads its features as numbers"),
        ("mlp", "dp-adam", "reads its features as numbers"),
        ("logistic-regression", "ht-dp-fw", "reads its features as numbers"),
        ("transformer-classifier", "ht-dp-fw", "trains linear-regression or logistic-regression only"),
    ]
    for model, algorithm, reason in cases:
        training = {"epochs": 1} if algorithm.startswith("ht-") else {"steps": 3, "batch_size": 8, "learning_rate": 0.1}
        spec = {
            "dataset_id": reviews["id"],
            "model": {"name": model},
            "algorithm": {"name": algorithm},
            "privacy": {"target_epsilon": 1.0},
            "training": training,
        }
        for endpoint in ("/v1/jobs/estimate", "/v1/jobs"):
            refused = alice.post(endpoint, json=spec)
            assert refused.status_code == 422, (model, algorithm, refused.text)
            assert refused.json()["type"] == "/problems/model-incompatible"
            assert reason in refused.json()["detail"]
    assert alice.get("/v1/jobs").json()["items"] == []
    assert alice.get(f"/v1/datasets/{reviews['id']}/budget").json()["reserved_epsilon"] == 0.0
