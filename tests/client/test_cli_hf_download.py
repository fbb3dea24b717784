"""``privtrain jobs download --format hf`` and ``Client.download_model(format="hf")`` against the
in-process app: an `hf` job's model arrives as a digest-checked ZIP of a Transformers folder."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from privtrain.cli import CliEnvironment, cli
from privtrain.client import Client
from privtrain.errors import PrivtrainError
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, api_key, transport  # noqa: F401
from tests.text_fixtures import classification_body
from tests.unit.worker.hf_fixtures import hf_config


def test_download_an_hf_model_as_a_transformers_folder(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    dispatcher: WorkerThreads,
    tmp_path: Path,
) -> None:
    dispatcher.run = True
    client = Client(BASE_URL, api_key=api_key, transport=transport)
    reviews = tmp_path / "reviews.jsonl"
    reviews.write_bytes(classification_body())
    dataset = client.upload_dataset(reviews, name="reviews", public=True, max_length=8)
    job = client.submit(
        {
            "dataset_id": dataset.id,
            "model": {"name": "hf", "params": {"task": "sequence-classification", "config": hf_config("distilbert")}},
            "algorithm": {"name": "adam"},
            "training": {"steps": 1, "batch_size": 8, "learning_rate": 0.01},
        }
    )
    dispatcher.join()
    assert client.get_job(job.id).status == "succeeded", dispatcher.outcomes

    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        ["jobs", "download", job.id, "--out", str(out), "--format", "hf", "--json"],
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    files = json.loads(result.stdout)
    assert files["model"] == str(out / f"{job.id}-hf.zip")
    with zipfile.ZipFile(files["model"]) as archive:
        config = json.loads(archive.read("config.json"))
    assert config["model_type"] == "distilbert" and config["architectures"] == ["DistilBertForSequenceClassification"]

    assert client.download_model(job.id, tmp_path, format="hf") == tmp_path / f"{job.id}-hf.zip"
    with pytest.raises(PrivtrainError) as no_adapter:  # an hf job without LoRA has no PEFT adapter
        client.download_model(job.id, tmp_path, format="peft")
    assert no_adapter.value.slug == "model-format-unavailable" and not (tmp_path / f"{job.id}-peft.zip").exists()
    lr = client.submit(
        {
            "dataset_id": dataset.id,
            "model": {"name": "transformer-classifier", "params": {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8}},
            "algorithm": {"name": "adam"},
            "training": {"steps": 1, "batch_size": 8, "learning_rate": 0.01},
        }
    )
    dispatcher.join()
    with pytest.raises(PrivtrainError) as refused:
        client.download_model(lr.id, tmp_path, format="hf")
    assert refused.value.slug == "model-format-unavailable"
    assert not (tmp_path / f"{lr.id}-hf.zip").exists()
