"""Tokenizers through the API: the built-in byte tokenizer, an uploaded tokenizer.json (checked,
stored by hash, tenant-scoped), a BPE trained on a public text dataset, training on a private one
refused with the reason, and text uploads tokenised with each."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from httpx import Response
from sqlalchemy import func, select

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Dataset, TokenizerRecord
from kernel.storage.references import blob_is_referenced
from kernel.tokenizers.hugging_face import load_tokenizer_json
from tests.text_fixtures import classification_body, jsonl, language_model_body, word_level_tokenizer_json


def _upload_tokenizer(client: TestClient, body: bytes, **params: object) -> Response:
    return client.post("/v1/tokenizers", params={"name": "words", **params}, content=body)


def _text_dataset(client: TestClient, body: bytes, **params: object) -> dict[str, object]:
    query: dict[str, object] = {"name": "corpus", "format": "jsonl", "max_length": 8, **params}
    if not query.get("public"):
        query.update(epsilon=8, delta=1e-3)
    response = client.post("/v1/datasets", params=query, content=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _files(settings: Settings) -> tuple[list[object], int]:
    files = sorted(p for p in settings.blob_dir.rglob("*") if p.is_file())
    temps = sorted(p for p in settings.tmp_dir.rglob("*") if p.is_file()) if settings.tmp_dir.exists() else []
    return [*files, *temps], len(files)


def _tokenizer_rows(database: Database) -> int:
    with database.read_session() as session:
        return session.scalar(select(func.count()).select_from(TokenizerRecord)) or 0


def test_the_byte_tokenizer_is_listed_and_shown_with_its_special_ids(alice: TestClient) -> None:
    items = alice.get("/v1/tokenizers").json()["items"]
    assert items[0]["id"] == "byte" and items[0]["kind"] == "built-in"
    shown = alice.get("/v1/tokenizers/byte").json()
    assert shown["vocab_size"] == 259 and shown["special_tokens"] == {"pad": 256, "bos": 257, "eos": 258}


def test_an_uploaded_tokenizer_is_stored_listed_and_tokenises_an_upload(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    response = _upload_tokenizer(alice, word_level_tokenizer_json(), source="made for the tests")
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["id"].startswith("tok_") and created["kind"] == "uploaded"
    assert created["vocab_size"] == 7 and created["pad_id"] == 6 and created["source"] == "made for the tests"
    assert [t["id"] for t in alice.get("/v1/tokenizers").json()["items"]] == ["byte", created["id"]]
    assert alice.get(f"/v1/tokenizers/{created['id']}").json()["sha256"] == created["sha256"]
    with database.read_session() as session:
        record = session.get(TokenizerRecord, created["id"])
        assert record is not None and blob_is_referenced(session, record.blob_key)

    dataset = _text_dataset(alice, jsonl([{"text": "a fine film"}, {"text": "dull"}]), tokenizer=created["id"])
    assert (dataset["tokenizer_id"], dataset["vocab_size"], dataset["pad_id"]) == (created["id"], 7, 6)
    with database.read_session() as session:
        stored_dataset = session.get(Dataset, str(dataset["id"]))
        assert stored_dataset is not None and stored_dataset.array_blob_key is not None
        key = stored_dataset.array_blob_key
    tokens = np.load(settings.blob_dir / key, allow_pickle=False)
    assert tokens.tolist() == [[1, 2, 3, 6, 6, 6, 6, 6], [4, 6, 6, 6, 6, 6, 6, 6]]


def test_a_pad_token_can_be_named(alice: TestClient) -> None:
    response = _upload_tokenizer(alice, word_level_tokenizer_json(with_pad=False), pad_token="[UNK]")
    assert response.status_code == 201 and response.json()["pad_id"] == 0


@pytest.mark.parametrize(
    ("body", "params", "slug"),
    [
        (b"{not a tokenizer", {}, "invalid-tokenizer"),
        (word_level_tokenizer_json(with_pad=False), {}, "tokenizer-without-pad"),
        (word_level_tokenizer_json(), {"pad_token": "<nope>"}, "tokenizer-without-pad"),
        (word_level_tokenizer_json(), {"name": "bad\nname"}, "invalid-tokenizer-request"),
    ],
)
def test_a_refused_tokenizer_upload_leaves_nothing(
    alice: TestClient, database: Database, settings: Settings, body: bytes, params: dict[str, object], slug: str
) -> None:
    before = _files(settings)
    response = _upload_tokenizer(alice, body, **params)
    assert response.status_code == 422, response.text
    assert response.json()["type"].endswith(f"/problems/{slug}")
    assert _files(settings) == before and _tokenizer_rows(database) == 0


def test_tokenizers_are_tenant_scoped(alice: TestClient, bob_headers: dict[str, str]) -> None:
    created = _upload_tokenizer(alice, word_level_tokenizer_json()).json()
    assert alice.get(f"/v1/tokenizers/{created['id']}", headers=bob_headers).status_code == 404
    assert [t["id"] for t in alice.get("/v1/tokenizers", headers=bob_headers).json()["items"]] == ["byte"]
    refused = alice.post(
        "/v1/datasets",
        params={"name": "x", "format": "jsonl", "public": True, "tokenizer": created["id"]},
        content=language_model_body(),
        headers=bob_headers,
    )
    assert refused.status_code == 422 and refused.json()["type"].endswith("/problems/unknown-tokenizer")


def test_a_tokenizer_trained_on_public_text_tokenises_later_uploads(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    public = _text_dataset(alice, language_model_body(repeat=8), public=True)
    response = alice.post("/v1/tokenizers/train", json={"dataset_id": public["id"], "vocab_size": 300, "name": "bpe"})
    assert response.status_code == 201, response.text
    trained = response.json()
    assert trained["kind"] == "trained" and trained["trained_from_dataset_id"] == public["id"]
    assert trained["pad_id"] == 0 and trained["special_tokens"] == {"pad": 0, "bos": 1, "eos": 2}
    assert 256 < trained["vocab_size"] <= 300

    dataset = _text_dataset(alice, classification_body(repeat=1), tokenizer=trained["id"])
    assert dataset["tokenizer_id"] == trained["id"] and dataset["vocab_size"] == trained["vocab_size"]
    with database.read_session() as session:
        record = session.get(TokenizerRecord, trained["id"])
        stored = session.get(Dataset, str(dataset["id"]))
        assert record is not None and stored is not None and stored.array_blob_key is not None
        tokenizer = load_tokenizer_json(
            (settings.blob_dir / record.blob_key).read_bytes(), pad_token=None, max_vocab=1000
        )
        tokens = np.load(settings.blob_dir / stored.array_blob_key, allow_pickle=False)
    first = tokenizer.encode_batch(["a fine film"])[0][:8]
    assert tokens[0].tolist() == first + [0] * (8 - len(first))


def test_training_on_a_private_dataset_is_refused_with_the_reason(
    alice: TestClient, database: Database, settings: Settings
) -> None:
    private = _text_dataset(alice, language_model_body())
    before = _files(settings)
    response = alice.post("/v1/tokenizers/train", json={"dataset_id": private["id"], "vocab_size": 300, "name": "x"})
    assert response.status_code == 409, response.text
    problem = response.json()
    assert problem["type"].endswith("/problems/tokenizer-on-private-data") and problem["dataset_id"] == private["id"]
    assert "reveals strings that occur in it" in problem["detail"]
    assert _files(settings) == before and _tokenizer_rows(database) == 0


def test_training_needs_a_readable_text_dataset_and_a_sane_vocabulary(
    alice: TestClient, bob_headers: dict[str, str], digits_csv: bytes
) -> None:
    tabular = alice.post(
        "/v1/datasets",
        params={"name": "d", "format": "csv", "public": True, "label_column": "label"},
        content=digits_csv,
    )
    assert tabular.status_code == 201, tabular.text
    not_text = alice.post(
        "/v1/tokenizers/train", json={"dataset_id": tabular.json()["id"], "vocab_size": 300, "name": "x"}
    )
    assert not_text.status_code == 422 and not_text.json()["type"].endswith("/problems/tokenizer-needs-text-dataset")
    public = _text_dataset(alice, language_model_body(), public=True)
    tiny = alice.post("/v1/tokenizers/train", json={"dataset_id": public["id"], "vocab_size": 10, "name": "x"})
    assert tiny.status_code == 422 and tiny.json()["type"].endswith("/problems/tokenizer-vocab-size")
    others = alice.post(
        "/v1/tokenizers/train", json={"dataset_id": public["id"], "vocab_size": 300, "name": "x"}, headers=bob_headers
    )
    assert others.status_code == 404
