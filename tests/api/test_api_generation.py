"""``POST /v1/jobs/{id}/generate`` end to end: a tiny DP language model trained in process, text
sampled from it by the real child process, the refusals, the 503 answers of a deployment that
cannot run the model, and the per-key generation budget."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import kernel.jobs.generation
from api.main import create_app
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.worker_jobs import run_on_worker
from tests.conftest import RecordingDispatcher, counts, make_settings, new_key
from tests.text_fixtures import classification_body, language_model_body

SIZES = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16}
FAKE_ANSWER = "import json; print(json.dumps({'text': 'ok', 'tokens_generated': 1}))"
BLOCK_TORCH_THEN_RUN_CHILD = """
import runpy, sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError(name)
        return None

sys.meta_path.insert(0, _NoTorch())
runpy.run_module("worker.generation", run_name="__main__")
"""


def _upload(alice: TestClient, body: bytes, **params: object) -> dict[str, Any]:
    query: dict[str, object] = {"name": "notes", "format": "jsonl", "max_length": 16, "epsilon": 8, "delta": 1e-3}
    response = alice.post("/v1/datasets", params={**query, **params}, content=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _lm_spec(dataset_id: str) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "transformer-lm", "params": SIZES},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 2, "batch_size": 8, "learning_rate": 0.1},
    }


@dataclass(frozen=True)
class FinishedLm:
    """One DP language-model job trained once for the module (training is the slow part)."""

    settings: Settings
    database: Database
    authorization: str
    job_id: str

    def client(self, **overrides: object) -> TestClient:
        """A client of a fresh app on the same data, with these settings changed."""
        settings = make_settings(self.settings.data_dir, **overrides) if overrides else self.settings
        client = TestClient(create_app(settings, dispatcher=RecordingDispatcher()))
        client.headers["Authorization"] = self.authorization
        return client


@pytest.fixture(scope="module")
def finished_lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FinishedLm]:
    settings = make_settings(tmp_path_factory.mktemp("generation") / "data")
    migrate(settings)
    database = Database(settings.resolved_database_url)
    authorization = f"Bearer {new_key(database, 'alice')}"
    with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as alice:
        alice.headers["Authorization"] = authorization
        notes = _upload(alice, language_model_body(), task="language-model")
        job_id = run_on_worker(alice, settings, database, _lm_spec(notes["id"]))
    yield FinishedLm(settings=settings, database=database, authorization=authorization, job_id=job_id)
    database.dispose()


def _stored_files(settings: Settings) -> list[str]:
    return sorted(str(p.relative_to(settings.data_dir)) for p in settings.blob_dir.rglob("*") if p.is_file())


def test_text_is_sampled_from_a_finished_dp_language_model(finished_lm: FinishedLm) -> None:
    settings, database, job_id = finished_lm.settings, finished_lm.database, finished_lm.job_id
    with finished_lm.client() as alice:
        before = (_stored_files(settings), counts(database), alice.get(f"/v1/jobs/{job_id}/events").json())
        response = alice.post(
            f"/v1/jobs/{job_id}/generate", json={"prompt": "a fine", "max_tokens": 5, "temperature": 0.7, "top_k": 5}
        )
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["prompt"] == "a fine" and 0 <= answer["tokens_generated"] <= 5
        assert len(answer["text"]) <= 5  # byte tokens: at most one character (or U+FFFD) each
        assert answer["model_sha256"] == alice.get(f"/v1/jobs/{job_id}/model").headers["X-Content-SHA256"]
        assert "post-processing" in answer["statement"] and "no privacy budget" in answer["statement"]
        assert "bounded by the job's guarantee" in answer["statement"]
        after = (_stored_files(settings), counts(database), alice.get(f"/v1/jobs/{job_id}/events").json())
        assert after == before  # nothing stored: no blob, no job, no ledger entry, no event
        report = alice.get(f"/v1/jobs/{job_id}/report").json()
    assert report["generation"]["post_processing"] is True
    assert "costs no privacy budget" in report["generation"]["statement"]


def test_refusals_run_nothing(alice: TestClient, bob_headers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel.jobs.generation, "child_command", lambda: ["/nonexistent/never-run"])
    notes = _upload(alice, language_model_body(), task="language-model")
    queued_lm = alice.post("/v1/jobs", json=_lm_spec(notes["id"])).json()["id"]
    reviews = _upload(alice, classification_body(), name="reviews")
    classifier = alice.post(
        "/v1/jobs",
        json={**_lm_spec(reviews["id"]), "model": {"name": "transformer-classifier", "params": SIZES}},
    )
    assert classifier.status_code == 202, classifier.text
    ok = {"prompt": "hello"}

    def problem(response: Any, status: int) -> str:
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        return str(response.json()["type"])

    path = f"/v1/jobs/{queued_lm}/generate"
    assert problem(alice.post(path, json=ok), 409) == "/problems/job-not-succeeded"
    assert problem(alice.post(path, json=ok, headers=bob_headers), 404) == "/problems/not-found"
    assert problem(alice.post("/v1/jobs/job_missing/generate", json=ok), 404) == "/problems/not-found"
    assert problem(alice.post(f"/v1/jobs/{classifier.json()['id']}/generate", json=ok), 422) == (
        "/problems/not-a-language-model"
    )
    for body in (
        {"prompt": "x" * 2001},
        {"prompt": ""},
        {"prompt": "hi", "max_tokens": 257},
        {"prompt": "hi", "max_tokens": 0},
        {"prompt": "hi", "temperature": 2.5},
        {"prompt": "hi", "top_k": 0},
        {"prompt": "hi", "max_tokens": "5"},  # strict: no coercion
        {"prompt": "hi", "seed": 1},  # unknown fields are refused, not ignored
    ):
        assert alice.post(path, json=body).status_code == 422, body
    assert alice.post(path, json=ok, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_deployment_that_cannot_run_the_model_answers_503(
    finished_lm: FinishedLm, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = f"/v1/jobs/{finished_lm.job_id}/generate"
    with finished_lm.client() as alice:
        monkeypatch.setattr(
            kernel.jobs.generation, "child_command", lambda: [sys.executable, "-c", BLOCK_TORCH_THEN_RUN_CHILD]
        )
        no_torch = alice.post(path, json={"prompt": "hi"})
        assert no_torch.status_code == 503 and no_torch.json()["type"] == "/problems/generation-unavailable"
        assert "torch is not installed" in no_torch.json()["detail"]

        monkeypatch.setattr(kernel.jobs.generation, "child_command", lambda: [str(Path("/nonexistent/python"))])
        not_started = alice.post(path, json={"prompt": "hi"})
        assert not_started.status_code == 503 and not_started.json()["type"] == "/problems/generation-unavailable"

        monkeypatch.setattr(
            kernel.jobs.generation, "child_command", lambda: [sys.executable, "-c", "import sys; sys.exit(3)"]
        )
        silent = alice.post(path, json={"prompt": "hi"})
        assert silent.status_code == 503 and "exit code 3" in silent.json()["detail"]


def test_a_slow_generation_is_stopped(finished_lm: FinishedLm, monkeypatch: pytest.MonkeyPatch) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    monkeypatch.setattr(kernel.jobs.generation, "child_command", lambda: sleeper)
    with finished_lm.client(generation_timeout_s=0.5) as alice:
        slow = alice.post(f"/v1/jobs/{finished_lm.job_id}/generate", json={"prompt": "hi"})
    assert slow.status_code == 503 and slow.json()["type"] == "/problems/generation-timed-out"
    assert slow.headers["Retry-After"] == "1"


def test_the_per_key_generation_budget_holds(finished_lm: FinishedLm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel.jobs.generation, "child_command", lambda: [sys.executable, "-c", FAKE_ANSWER])
    with finished_lm.client(generation_burst=2, generation_per_minute=1) as alice:
        refused_first = alice.post("/v1/jobs/job_missing/generate", json={"prompt": "hi"})
        answers = [alice.post(f"/v1/jobs/{finished_lm.job_id}/generate", json={"prompt": "hi"}) for _ in range(3)]
    assert refused_first.status_code == 404  # a refused request spends none of the budget
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].json()["text"] == "ok"
    assert answers[2].json()["type"] == "/problems/generation-rate-limited"
    assert 1 <= int(answers[2].headers["Retry-After"]) <= 60
