"""Text datasets end to end through the API: a JSON Lines upload is tokenised once into a stored
(n, max_length) token-id array, described publicly (modality, tokenizer, vocabulary, pad id,
max_length), loaded by the worker as the contract says, and a refused upload leaves nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import func, select

from dp.data.tokens import IGNORED_TARGET, TokenRows
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, LedgerEntry, PrivacyBudget, TokenizerRecord
from kernel.tokenizers.byte import PAD_ID, ByteTokenizer
from tests.text_fixtures import REVIEWS, classification_body, jsonl, language_model_body
from worker.job_data import load_data_and_units
from worker.runner import JobRunner


def _upload(client: TestClient, body: bytes, **params: object) -> Response:
    query: dict[str, object] = {"name": "reviews", "format": "jsonl", "epsilon": 8, "delta": 1e-3, "max_length": 16}
    query.update(params)
    return client.post("/v1/datasets", params={k: v for k, v in query.items() if v is not None}, content=body)


def _stored(database: Database, settings: Settings) -> tuple[object, ...]:
    """Rows, budgets, ledger entries, tokenizers, blob files and temp files: what a refusal must not change."""
    with database.read_session() as session:
        counts = tuple(
            session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Dataset, PrivacyBudget, LedgerEntry, TokenizerRecord)
        )
    files = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    temps = sorted(p for p in settings.tmp_dir.rglob("*") if p.is_file()) if settings.tmp_dir.exists() else []
    return (*counts, files + temps)


def _dataset(database: Database, dataset_id: str) -> Dataset:
    with database.read_session() as session:
        dataset = session.get(Dataset, dataset_id)
        assert dataset is not None
        session.expunge(dataset)
    return dataset


def test_a_labelled_jsonl_upload_is_a_tokenised_classification_dataset(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    response = _upload(alice, classification_body())
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["modality"] == "text" and body["format"] == "jsonl" and body["task"] == "classification"
    assert body["tokenizer_id"] == "byte" and body["vocab_size"] == 259 and body["pad_id"] == PAD_ID
    assert body["max_length"] == 16 and body["feature_shape"] == [16] and body["n_features"] == 16
    assert body["n_rows"] == 24 and body["classes"] == ["bad", "good"] and body["text_field"] == "text"
    assert body["label_column"] == "label" and body["image_shape"] is None
    assert not any("truncat" in key for key in body)  # how many texts were cut is a fact of the private texts
    assert [n for n in body["notices"] if "inferred" in n] == []  # the task follows from the members, not values

    dataset = _dataset(database, body["id"])
    assert dataset.array_blob_key is not None and dataset.array_blob_key != dataset.blob_key
    stored = np.load(settings.blob_dir / dataset.array_blob_key, mmap_mode="r", allow_pickle=False)
    assert isinstance(stored, np.memmap) and stored.dtype == np.uint16 and stored.shape == (24, 16)
    texts = [text for text, _label in REVIEWS * 4]
    expected = [(ByteTokenizer().encode(t)[:16] + [PAD_ID] * 16)[:16] for t in texts]
    assert stored.tolist() == expected

    data = load_data_and_units(JobRunner(settings, db=database).ctx, dataset, torch.device("cpu"))

    rows, y = data.rows, data.y
    assert isinstance(rows, TokenRows) and rows.row_shape == (16,) and rows.n_rows == 24
    assert torch.equal(rows.take(torch.tensor([0, 5])), torch.tensor([expected[0], expected[5]]))
    assert y.dtype == torch.int64 and y.tolist() == [1 if label == "good" else 0 for _t, label in REVIEWS * 4]


def test_an_unlabelled_jsonl_upload_is_a_language_model_dataset(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    response = _upload(alice, language_model_body(), max_length=12, task="language-model")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["task"] == "language-model" and body["n_classes"] is None and body["classes"] is None
    assert body["label_column"] is None and body["feature_shape"] == [12]
    dataset = _dataset(database, body["id"])
    data = load_data_and_units(JobRunner(settings, db=database).ctx, dataset, torch.device("cpu"))
    rows, y = data.rows, data.y
    tokens = rows.take(torch.arange(rows.n_rows))
    assert y.shape == (24, 12) and y.dtype == torch.int64
    assert torch.equal(y, torch.where(tokens == PAD_ID, IGNORED_TARGET, tokens))
    assert int((y == IGNORED_TARGET).sum()) > 0  # "a fine film" is shorter than 12 bytes


def test_renamed_members_and_a_declared_class_list(alice: TestClient) -> None:
    records = [{"body": t, "stars": 5 if label == "good" else 1} for t, label in REVIEWS]
    response = _upload(alice, jsonl(records), text_field="body", label_field="stars", classes="1,5")
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["classes"] == ["1", "5"] and body["classes_source"] == "declared"
    assert body["text_field"] == "body" and body["label_column"] == "stars"


@pytest.mark.parametrize(
    ("body", "params", "slug"),
    [
        (b'{"text": "a"}\n{"text": oops}\n', {}, "jsonl-invalid-line"),
        (b'{"text": "a"}\n{"text": "\xff"}\n', {}, "text-not-utf8"),
        (b'{"text": "a"}\n{"words": "b"}\n', {}, "jsonl-missing-field"),
        (b'{"text": "a", "label": [1]}\n', {}, "jsonl-bad-field"),
        (b"", {}, "jsonl-empty"),
        (language_model_body(), {"max_length": 0}, "bad-text-options"),
        (language_model_body(), {"max_length": 5000}, "bad-text-options"),
        (language_model_body(), {"task": "classification"}, "jsonl-missing-field"),
        (language_model_body(), {"task": "regression"}, "unknown-text-task"),
        (language_model_body(), {"modality": "image"}, "bad-text-options"),
        (language_model_body(), {"format": "csv"}, "bad-text-options"),  # text options on a CSV
        (language_model_body(), {"tokenizer": "tok_000000000000000000000000"}, "unknown-tokenizer"),
        (language_model_body(), {"delta": 0.5}, "invalid-budget"),
    ],
)
def test_a_refused_text_upload_is_a_problem_and_leaves_nothing(
    alice: TestClient, database: Database, settings: Settings, body: bytes, params: dict[str, object], slug: str
) -> None:
    before = _stored(database, settings)
    response = _upload(alice, body, **params)
    assert response.status_code == 422, response.text
    assert response.json()["type"].endswith(f"/problems/{slug}")
    assert _stored(database, settings) == before


def test_a_duplicate_and_an_idempotent_retry(alice: TestClient, database: Database, settings: Settings) -> None:
    body = classification_body()
    headers = {"Idempotency-Key": "text-1"}
    params = {"name": "reviews", "format": "jsonl", "epsilon": 8, "delta": 1e-3, "max_length": 16}
    first = alice.post("/v1/datasets", params=params, content=body, headers=headers)
    assert first.status_code == 201, first.text
    after_first = _stored(database, settings)
    assert len(after_first[4]) == 2  # type: ignore[arg-type]  # the upload as sent, and its token ids
    again = alice.post("/v1/datasets", params=params, content=body, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = alice.post("/v1/datasets", params={**params, "max_length": 8}, content=body, headers=headers)
    assert other.status_code == 422 and other.json()["type"].endswith("/problems/idempotency-key-reused")
    duplicate = _upload(alice, body, max_length=8)
    assert duplicate.status_code == 409 and duplicate.json()["type"].endswith("/problems/dataset-already-registered")
    assert _stored(database, settings) == after_first


def test_facts_carry_the_vocabulary_and_pad_id(alice: TestClient, database: Database) -> None:
    from kernel.datasets.stored_facts import facts_of

    dataset_id = _upload(alice, language_model_body()).json()["id"]
    facts = facts_of(_dataset(database, dataset_id))
    assert (facts.vocab_size, facts.pad_id, facts.feature_shape, facts.task) == (259, PAD_ID, (16,), "language-model")


def test_the_listing_shows_text_datasets(alice: TestClient) -> None:
    dataset_id = _upload(alice, language_model_body()).json()["id"]
    (item,) = [d for d in alice.get("/v1/datasets").json()["items"] if d["id"] == dataset_id]
    assert item["modality"] == "text" and item["tokenizer_id"] == "byte" and item["max_length"] == 16


def test_a_refusal_never_echoes_the_text(alice: TestClient) -> None:
    secret = "my card number is 4111"
    response = _upload(alice, jsonl([{"text": "fine"}]) + json.dumps({"text": secret})[:-2].encode() + b"\n")
    assert response.status_code == 422 and "4111" not in response.text
