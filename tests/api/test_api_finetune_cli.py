"""The pretrain → fine-tune flow through the `privtrain` CLI (in-process app, worker threads):
a public upload, a non-private sgd job, a base-model upload, and a DP-SGD head fine-tuning job
started from the public job's model (docs/pretraining-and-finetuning.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from safetensors.torch import save_file

from privtrain.cli import CliEnvironment, cli
from privtrain_common.zoo.architectures import build_model
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, api_key, dispatcher, transport  # noqa: F401
from tests.conftest import digits_split, to_csv


def _cli(transport: AppTransport, key: str, *args: str) -> Any:  # noqa: F811
    result: Result = CliRunner().invoke(
        cli,
        [*args, "--json"],
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
    )
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout)


def test_cli_pretrain_then_finetune(
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    dispatcher: WorkerThreads,  # noqa: F811
    tmp_path: Path,
) -> None:
    X, X_other, y, y_other = digits_split()
    public_csv, private_csv = tmp_path / "public.csv", tmp_path / "private.csv"
    public_csv.write_bytes(to_csv(X, y))
    private_csv.write_bytes(to_csv(X_other, y_other))
    public = _cli(transport, api_key, "datasets", "upload", str(public_csv), "--public")
    assert public["public"] is True and public["budget"] is None
    private = _cli(transport, api_key, "datasets", "upload", str(private_csv), "--epsilon", "4", "--delta", "1e-5")

    mlp = ["--model", "mlp", "--model-param", "hidden_sizes=[16]"]
    schedule = ["--steps", "10", "--batch-size", "64"]
    estimate = CliRunner().invoke(
        cli,
        ["jobs", "estimate", "--dataset", public["id"], *mlp, "--algorithm", "sgd", *schedule, "--lr", "0.1"],
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
    )
    assert estimate.exit_code == 0 and "public: no budget, nothing is charged" in estimate.stdout, estimate.stdout
    listed = CliRunner().invoke(
        cli, ["datasets", "list"], obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
    )  # fmt: skip
    assert listed.exit_code == 0 and "public" in listed.stdout, listed.stdout

    dispatcher.run = True
    pretrain = _cli(
        transport, api_key, "jobs", "submit", "--dataset", public["id"], *mlp, "--algorithm", "sgd",
        *schedule, "--lr", "0.1", "--wait", "--interval", "0.05",
    )  # fmt: skip
    assert pretrain["status"] == "succeeded", pretrain
    finetuned = _cli(
        transport, api_key, "jobs", "submit", "--dataset", private["id"], *mlp, "--algorithm", "dp-sgd",
        "--target-epsilon", "2", *schedule, "--lr", "0.5", "--init-job", pretrain["id"], "--finetune", "head",
        "--wait", "--interval", "0.05",
    )  # fmt: skip
    assert finetuned["status"] == "succeeded", finetuned
    again = CliRunner().invoke(  # fine-tuning the private job's model on the same rows: a warning
        cli,
        ["jobs", "estimate", "--dataset", private["id"], *mlp, "--algorithm", "dp-sgd", "--target-epsilon", "2",
         *schedule, "--lr", "0.5", "--init-job", finetuned["id"]],
        obj=CliEnvironment(transport=transport),
        env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
    )  # fmt: skip
    assert again.exit_code == 0, again.stdout
    assert "ε of the released model (with 1 earlier job(s) on these rows)" in again.stdout
    assert "it would use them again" in again.stdout
    downloaded = _cli(transport, api_key, "jobs", "download", finetuned["id"], "--out", str(tmp_path))
    report = json.loads(Path(downloaded["report"]).read_text())
    assert report["init"]["job_id"] == pretrain["id"] and report["init"]["dataset_public"] is True

    weights = tmp_path / "base.safetensors"
    model = build_model("mlp", {"hidden_sizes": [16]}, input_shape=(64,), n_outputs=10)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    base = _cli(
        transport, api_key, "base-models", "upload", str(weights), "--architecture", "mlp",
        "--model-param", "hidden_sizes=[16]", "--input-shape", "64", "--n-outputs", "10", "--source", "a test",
    )  # fmt: skip
    assert base["id"].startswith("bm_") and base["source"] == "a test"
    assert [b["id"] for b in _cli(transport, api_key, "base-models", "list")] == [base["id"]]
    assert _cli(transport, api_key, "base-models", "show", base["id"])["sha256"] == base["sha256"]
    from_base = _cli(
        transport, api_key, "jobs", "submit", "--dataset", private["id"], *mlp, "--algorithm", "dp-sgd",
        "--target-epsilon", "1", *schedule, "--lr", "0.5", "--init-base-model", base["id"], "--wait",
        "--interval", "0.05",
    )  # fmt: skip
    assert from_base["status"] == "succeeded", from_base
