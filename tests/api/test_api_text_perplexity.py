"""DP perplexity end to end: a language-model job with an ``evaluation`` block is priced with the
evaluation's Laplace charge composed onto training, runs on the in-process worker, and its job,
JSON report, HTML report and `privtrain jobs show` hold the released perplexity and mean token loss."""

from __future__ import annotations

import math
from typing import Any

from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from privtrain.cli.job_views import job_block
from privtrain.resources import Job
from tests.api.worker_jobs import run_on_worker
from tests.text_fixtures import classification_body, language_model_body

SIZES = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16}
EVALUATION = {"holdout_fraction": 0.25, "mechanism": "laplace", "epsilon": 1.0}


def _upload(alice: TestClient, body: bytes, **params: object) -> dict[str, Any]:
    query: dict[str, object] = {"name": "notes", "format": "jsonl", "max_length": 16, "epsilon": 8, "delta": 1e-3}
    response = alice.post("/v1/datasets", params={**query, **params}, content=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _lm_spec(dataset_id: str, evaluation: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "transformer-lm", "params": SIZES},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.1},
        **({"evaluation": evaluation} if evaluation is not None else {}),
    }


def test_a_language_model_job_releases_a_dp_perplexity(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    notes = _upload(alice, language_model_body(repeat=6), task="language-model")
    clip = 2 * math.log(notes["vocab_size"])  # the documented default loss_clip

    without = alice.post("/v1/jobs/estimate", json=_lm_spec(notes["id"], None))
    priced = alice.post("/v1/jobs/estimate", json=_lm_spec(notes["id"], EVALUATION))
    assert without.status_code == priced.status_code == 200, priced.text
    # Laplace with b = R / ε on a sum of sensitivity R is ε-DP (ε = R / b); the ledger reads it off its
    # Rényi curve at δ, a little above
    assert 1.0 <= priced.json()["evaluation_epsilon"] <= 1.05
    interval = priced.json()["evaluation_interval"]  # sized before anything is spent
    assert without.json()["evaluation_interval"] is None and interval["metric"] == "perplexity"
    assert interval["perplexity_factor"] > 1 and "factor" in interval["statement"]
    assert priced.json()["epsilon_ledger"] > without.json()["epsilon_ledger"]  # composed with training

    job_id = run_on_worker(alice, settings, database, _lm_spec(notes["id"], EVALUATION))
    job = alice.get(f"/v1/jobs/{job_id}").json()
    metrics = job["metrics"]
    assert metrics["metric"] == "perplexity" and metrics["mechanism"] == "laplace"
    assert metrics["sensitivity"] == metrics["loss_clip"] == clip
    assert metrics["noise_scale_on_sum"] == clip / 1.0
    assert 1.0 <= metrics["perplexity"] <= math.exp(clip)
    assert math.isclose(metrics["perplexity"], math.exp(metrics["mean_token_loss"]))
    (token_loss,) = metrics["also_released"]
    assert token_loss["mean_token_loss"] == metrics["mean_token_loss"]
    assert token_loss["noise_scale"] == clip / (0.25 * notes["n_rows"])
    assert math.isclose(metrics["interval"]["low"], math.exp(token_loss["interval"]["low"]))

    report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["released_metrics"] == metrics
    assert any(caveat.startswith("Perplexity is exp of the released mean token loss") for caveat in report["caveats"])
    page = alice.get(f"/v1/jobs/{job_id}/report", params={"format": "html"})
    assert page.status_code == 200
    table = page.text.split('<table id="released-metrics">', 1)[1].split("</table>", 1)[0]
    assert "<th>perplexity</th>" in table and "<th>mean_token_loss</th>" in table

    shown = job_block(Job.from_api(job))
    metric_lines = shown.split("released DP metrics\n", 1)[1].splitlines()
    assert metric_lines[0].split()[:2] == ["METRIC", "RELEASED"]
    assert metric_lines[1].split()[:2] == ["perplexity", f"{metrics['perplexity']:.4g}"]
    assert metric_lines[2].split()[:2] == ["mean_token_loss", f"{metrics['mean_token_loss']:.4g}"]


def test_evaluation_fields_of_another_task_are_refused(alice: TestClient) -> None:
    notes = _upload(alice, language_model_body(), task="language-model")
    refused = alice.post(
        "/v1/jobs/estimate", json=_lm_spec(notes["id"], {**EVALUATION, "error_clip": 1.0})
    )  # fmt: skip
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/invalid-job-spec"
    assert "evaluation.error_clip applies to regression datasets" in refused.json()["detail"]

    reviews = _upload(alice, classification_body(), name="reviews")
    spec = {
        **_lm_spec(reviews["id"], {**EVALUATION, "loss_clip": 3.0}),
        "model": {"name": "transformer-classifier", "params": SIZES},
    }
    refused = alice.post("/v1/jobs/estimate", json=spec)
    assert refused.status_code == 422 and refused.json()["type"] == "/problems/invalid-job-spec"
    assert "evaluation.loss_clip applies to language-model datasets" in refused.json()["detail"]
