"""``privtrain base-models upload-hf`` and ``Client.upload_hf_base_model`` against the in-process
app: a ``save_pretrained`` folder (zipped by the client) becomes an `hf` base model; a body that
is not a ZIP is a problem."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from privtrain.cli import CliEnvironment, cli
from privtrain.client import Client
from privtrain.errors import PrivtrainError
from privtrain.transfers import zipped_checkpoint
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401

transformers = pytest.importorskip("transformers")


def _checkpoint(tmp_path: Path) -> Path:
    config = transformers.DistilBertConfig(dim=16, n_layers=1, n_heads=2, hidden_dim=24, vocab_size=300, num_labels=3)
    folder = tmp_path / "distil"
    transformers.DistilBertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_upload_a_checkpoint_folder_with_the_cli_and_read_it_with_the_client(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    folder = _checkpoint(tmp_path)
    result = CliRunner().invoke(
        cli,
        ["base-models", "upload-hf", str(folder), "--source", "a test", "--json"],
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    shown = json.loads(result.stdout)
    assert shown["name"] == "distil" and shown["format"] == "hf"
    assert shown["model_class"] == "DistilBertForSequenceClassification" and shown["n_outputs"] == 3

    assert shown["archive_sha256"] == hashlib.sha256(zipped_checkpoint(folder)).hexdigest()  # the folder, zipped

    client = Client(BASE_URL, api_key=api_key, transport=transport)
    assert client.get_base_model(shown["id"]).parameter_count == shown["parameter_count"]
    with pytest.raises(PrivtrainError) as refused:
        client.upload_hf_base_model(b"not a zip", name="broken")
    assert refused.value.type.endswith("/invalid-hf-archive")
