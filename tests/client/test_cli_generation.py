"""``Client.generate`` and ``privtrain jobs generate`` against the in-process app: the options reach
the child process (a stand-in that echoes them, so no model runs here; the real sampling is in
tests/api/test_api_generation.py), the text is printed, and refusals exit non-zero."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import kernel.jobs.generation
from privtrain.cli import CliEnvironment, cli
from privtrain.client import Client
from privtrain.errors import PrivtrainError
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, api_key, transport  # noqa: F401
from tests.text_fixtures import language_model_body

ECHO_CHILD = (
    "import json, sys; r = json.load(sys.stdin); "
    "print(json.dumps({'text': '|'.join(str(r[k]) for k in ('prompt', 'max_tokens', 'temperature', 'top_k')), "
    "'tokens_generated': 2}))"
)


def _invoke(transport: AppTransport, key: str, *args: str) -> Result:  # noqa: F811
    return CliRunner().invoke(
        cli,
        list(args),
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )


def _finished_lm(client: Client, tmp_path: Path, dispatcher: WorkerThreads) -> str:
    dispatcher.run = True
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(language_model_body())
    dataset = client.upload_dataset(corpus, name="corpus", public=True, max_length=8)
    job = client.submit(
        {
            "dataset_id": dataset.id,
            "model": {"name": "transformer-lm", "params": {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16}},
            "algorithm": {"name": "adam"},
            "training": {"steps": 1, "batch_size": 8, "learning_rate": 0.01},
        }
    )
    dispatcher.join()
    assert client.get_job(job.id).status == "succeeded", dispatcher.outcomes
    return job.id


def test_generate_from_the_client_and_the_cli(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    dispatcher: WorkerThreads,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernel.jobs.generation, "child_command", lambda: [sys.executable, "-c", ECHO_CHILD])
    client = Client(BASE_URL, api_key=api_key, transport=transport)
    job_id = _finished_lm(client, tmp_path, dispatcher)

    answer: dict[str, Any] = client.generate(job_id, "once upon", max_tokens=7, temperature=0, top_k=3)
    assert answer["text"] == "once upon|7|0.0|3" and answer["tokens_generated"] == 2
    assert answer["prompt"] == "once upon" and "post-processing" in answer["statement"]
    assert "the dataset is public" in answer["statement"]  # no guarantee to lean on
    assert client.generate(job_id, "hi")["text"] == "hi|64|1.0|None"  # the defaults

    printed = _invoke(transport, api_key, "jobs", "generate", job_id, "--prompt", "hey", "--max-tokens", "5")
    assert printed.exit_code == 0, (printed.stdout, printed.stderr)
    assert printed.stdout == "hey|5|1.0|None\n"
    as_json = _invoke(
        transport,
        api_key,
        "jobs",
        "generate",
        job_id,
        "--prompt",
        "hey",
        "--temperature",
        "0.5",
        "--top-k",
        "2",
        "--json",
    )
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["text"] == "hey|64|0.5|2"

    refused = _invoke(transport, api_key, "jobs", "generate", job_id, "--prompt", "x", "--max-tokens", "300")
    assert refused.exit_code != 0  # the CLI bounds max_tokens as the API does
    statement = client.get_report(job_id)["generation"]["statement"]
    assert "post-processing" in statement and "the dataset is public" in statement  # no guarantee to lean on

    with pytest.raises(PrivtrainError) as missing:
        client.generate("job_missing", "hi")
    assert missing.value.status == 404
