"""Text through the `privtrain` CLI and Client: a .jsonl upload with --tokenizer/--max-length and
renamed members, and `privtrain tokenizers upload|train|list|show` (in-process app)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from privtrain.cli import CliEnvironment, cli
from privtrain.client import Client
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.text_fixtures import REVIEWS, jsonl, language_model_body, word_level_tokenizer_json


def _invoke(transport: AppTransport, key: str, *args: str) -> Result:  # noqa: F811
    return CliRunner().invoke(
        cli,
        list(args),
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )


def _json(transport: AppTransport, key: str, *args: str) -> Any:  # noqa: F811
    result = _invoke(transport, key, *args, "--json")
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout)


def test_cli_uploads_jsonl_and_manages_tokenizers(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_bytes(jsonl([{"body": text, "sentiment": label} for text, label in REVIEWS]))
    dataset = _json(
        transport,
        api_key,
        *("datasets", "upload", str(reviews), "--epsilon", "8", "--delta", "1e-3"),
        *("--tokenizer", "byte", "--max-length", "12", "--text-field", "body", "--label-field", "sentiment"),
    )
    assert dataset["format"] == "jsonl" and dataset["modality"] == "text" and dataset["task"] == "classification"
    assert (
        dataset["feature_shape"] == [12] and dataset["tokenizer_id"] == "byte" and dataset["classes"] == ["bad", "good"]
    )
    shown = _invoke(transport, api_key, "datasets", "show", dataset["id"])
    assert shown.exit_code == 0 and "tokenizer" in shown.stdout and "259" in shown.stdout, shown.stdout

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(language_model_body(repeat=8))
    public = _json(transport, api_key, "datasets", "upload", str(corpus), "--public", "--max-length", "16")
    assert public["task"] == "language-model"

    words = tmp_path / "words.json"
    words.write_bytes(word_level_tokenizer_json())
    uploaded = _json(transport, api_key, "tokenizers", "upload", str(words), "--source", "tests")
    assert uploaded["name"] == "words" and uploaded["kind"] == "uploaded" and uploaded["pad_id"] == 6
    trained = _json(transport, api_key, "tokenizers", "train", public["id"], "--vocab-size", "300", "--name", "bpe")
    assert trained["kind"] == "trained" and trained["trained_from_dataset_id"] == public["id"]
    listed = _json(transport, api_key, "tokenizers", "list")
    assert [t["id"] for t in listed] == ["byte", trained["id"], uploaded["id"]]
    assert _json(transport, api_key, "tokenizers", "show", "byte")["vocab_size"] == 259
    table = _invoke(transport, api_key, "tokenizers", "list")
    assert table.exit_code == 0 and "built-in" in table.stdout and "bpe" in table.stdout

    refused = _invoke(transport, api_key, "tokenizers", "train", dataset["id"], "--vocab-size", "300", "--name", "x")
    assert refused.exit_code != 0 and "reveals strings" in (refused.stdout + refused.stderr)


def test_client_tokenizer_methods(transport: AppTransport, api_key: str) -> None:  # noqa: F811
    client = Client(BASE_URL, api_key=api_key, transport=transport)
    uploaded = client.upload_tokenizer(word_level_tokenizer_json(), name="words")
    assert uploaded.id.startswith("tok_") and uploaded.vocab_size == 7
    assert [t.id for t in client.list_tokenizers()] == ["byte", uploaded.id]
    assert client.get_tokenizer(uploaded.id).pad_id == 6
    dataset = client.upload_dataset(
        language_model_body(), name="corpus", format="jsonl", public=True, tokenizer=uploaded.id, max_length=4
    )
    assert (dataset.tokenizer_id, dataset.vocab_size, dataset.pad_id, dataset.max_length) == (uploaded.id, 7, 6, 4)
    trained = client.train_tokenizer(dataset_id=dataset.id, vocab_size=300, name="bpe")
    assert trained.kind == "trained" and trained.trained_from_dataset_id == dataset.id
