"""Every ``privtrain`` command through click's CliRunner against the real app in-process: ``--json``
output parsed and checked, human tables spot-checked, exit codes 0 / 1 (API problem) / 2 (usage)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kernel.db.engine import Database
from privtrain.cli import CliEnvironment, cli
from privtrain_common.directed_rounding import format_guarantee
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads
from tests.conftest import new_key

Run = Callable[..., Result]


@pytest.fixture
def run(transport: AppTransport, api_key: str) -> Run:
    """Invoke the CLI configured through the environment, as a user would."""
    runner = CliRunner()

    def invoke(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
        return runner.invoke(
            cli,
            list(args),
            obj=CliEnvironment(transport=transport),
            env=env if env is not None else {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key},
            input=input,
        )

    return invoke


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout)


@pytest.fixture
def dataset_id(run: Run, digits_path: Path) -> str:
    return ok_json(run("datasets", "upload", str(digits_path), "--epsilon", "8", "--delta", "1e-5", "--json"))["id"]


ALGORITHM = [
    "--model",
    "logistic-regression",
    "--algorithm",
    "dp-sgd",
    "--hyper",
    "clipping_norm=1.0",
    "--hyper",
    "momentum=0.9",
]
CALIBRATED = [*ALGORITHM, "--target-epsilon", "4", "--epochs", "2", "--batch-size", "64", "--lr", "0.5"]
# 4 steps at a fixed σ: trains in well under a second and is priced without a calibration search
TINY_TRAINING = ["--steps", "4", "--batch-size", "256", "--lr", "0.5"]
TINY = [*ALGORITHM, "--noise-multiplier", "5", *TINY_TRAINING]


def test_datasets_commands(run: Run, digits_path: Path, digits_csv: bytes) -> None:
    uploaded = ok_json(
        run(
            "datasets",
            "upload",
            str(digits_path),
            "--name",
            "digits-train",
            "--epsilon",
            "8",
            "--delta",
            "1e-5",
            "--json",
        )
    )
    ds = uploaded["id"]
    assert (uploaded["name"], uploaded["n_rows"], uploaded["budget"]) == (
        "digits-train",
        1437,
        {"epsilon": 8.0, "delta": 1e-5},
    )
    assert uploaded["sha256"] == hashlib.sha256(digits_csv).hexdigest()
    assert [d["id"] for d in ok_json(run("--json", "datasets", "list"))] == [ds]
    assert len(uploaded.pop("notices")) == 2  # the inferred task and observed class list: said once
    assert ok_json(run("datasets", "show", ds, "--json")) == {**uploaded, "notices": []}

    table = run("datasets", "list")
    assert table.exit_code == 0
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "ROWS"] and row.split()[:3] == [ds, "digits-train", "1437"]

    budget = ok_json(run("datasets", "budget", ds, "--json"))
    assert budget["epsilon"] == 8.0 and budget["entries"] == 0
    assert "remaining ε" in run("datasets", "budget", ds).stdout
    raised = ok_json(run("datasets", "raise-budget", ds, "--epsilon", "10", "--reason", "year 2", "--json"))
    assert raised["epsilon"] == 10.0 and raised["delta"] == 1e-5 and raised["entries"] == 1
    ledger = ok_json(run("datasets", "ledger", ds, "--json"))
    assert [e["kind"] for e in ledger] == ["ADJUST"] and ledger[0]["details"]["reason"] == "year 2"
    assert run("datasets", "ledger", ds).stdout.splitlines()[1].split()[:2] == ["1", "ADJUST"]


def test_catalogue_commands(run: Run) -> None:
    algorithms = ok_json(run("algorithms", "--json"))
    assert "dp-sgd" in {a["name"] for a in algorithms}
    one = ok_json(run("algorithms", "dp-sgd", "--json"))
    assert one["defaults"]["clipping_norm"] == 1.0
    assert "clipping_norm" in run("algorithms", "dp-sgd").stdout
    assert one["training_fields"] == [
        "augmult",
        "batch_size",
        "ema_decay",
        "epochs",
        "learning_rate",
        "precision",
        "rows_per_unit",
        "steps",
        "time_limit_s",
    ]
    lines = run("algorithms", "kl-spider").stdout.splitlines()
    assert any(
        line.startswith("training fields") and line.endswith(" epochs, rows_per_unit, steps, time_limit_s")
        for line in lines
    )
    models = ok_json(run("models", "--json"))
    assert {"logistic-regression", "mlp"} <= {m["name"] for m in models}
    table = run("models").stdout
    assert table.startswith("NAME") and "…" not in table and "…" not in run("algorithms").stdout  # wrapped, never cut
    names = [line.split()[0] for line in table.splitlines()[1:] if line and not line.startswith(" ")]
    assert names == sorted(names) and set(names) == {m["name"] for m in models}  # one first line per model, sorted
    hf = run("models", "hf").stdout
    assert "lora" in hf and "task" in hf and "config" in hf
    assert run("models", "nope").exit_code == 2


def test_estimate_from_flags_and_from_a_yaml_spec(run: Run, dataset_id: str, tmp_path: Path) -> None:
    from_flags = ok_json(run("jobs", "estimate", "--dataset", dataset_id, *CALIBRATED, "--json"))
    assert from_flags["steps"] == 45 and from_flags["admissible"] is True
    assert from_flags["epsilon_ledger"] == pytest.approx(4.0, rel=1e-3)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        f"dataset_id: {dataset_id}\nmodel: {{name: logistic-regression}}\n"
        "algorithm: {name: dp-sgd, hyperparameters: {clipping_norm: 1.0, momentum: 0.9}}\n"
        "privacy: {target_epsilon: 4}\ntraining: {epochs: 2, batch_size: 64, learning_rate: 0.5}\n"
    )
    assert ok_json(run("jobs", "estimate", "--spec", str(spec), "--json")) == from_flags
    # flags override the file: a fixed σ replaces the file's target ε
    # flags override the file (a fixed σ replaces the file's target ε); the human rendering
    fixed = run("jobs", "estimate", "--spec", str(spec), "--noise-multiplier", "3")
    assert fixed.exit_code == 0, fixed.stderr
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in fixed.stdout.splitlines())
    assert shown["noise multiplier σ"] == "3" and shown["admissible now"] == "yes"
    exact = ok_json(run("jobs", "estimate", "--spec", str(spec), "--noise-multiplier", "3", "--json"))
    label = f"ε reserved at δ={format_guarantee(exact['delta'])}"
    # a guarantee is printed rounded up, the remaining budget rounded down (never to nearest)
    assert float(shown[label]) >= exact["epsilon_reserved"] == exact["epsilon_ledger"]
    assert float(shown[label]) < from_flags["epsilon_reserved"]
    assert float(shown["budget remaining ε"]) <= exact["budget_remaining_epsilon"]
    assert float(shown["largest admissible target ε"]) <= exact["largest_admissible_epsilon"]


def test_submit_list_show_events_cancel(run: Run, dataset_id: str, dispatcher: WorkerThreads) -> None:
    job = ok_json(run("jobs", "submit", "--dataset", dataset_id, *TINY, "--json"))
    assert job["status"] == "queued" and job["steps_planned"] == 4 and dispatcher.sent == [job["id"]]
    assert job["spec"]["algorithm"]["hyperparameters"]["momentum"] == 0.9
    assert [j["id"] for j in ok_json(run("jobs", "list", "--json"))] == [job["id"]]
    assert ok_json(run("jobs", "list", "--status", "succeeded", "--json")) == []
    assert ok_json(run("jobs", "show", job["id"], "--json"))["id"] == job["id"]
    assert "0/4 " in run("jobs", "list").stdout
    cancelled = ok_json(run("jobs", "cancel", job["id"], "--json"))
    assert cancelled["status"] == "cancelled"
    events = ok_json(run("jobs", "events", job["id"], "--json"))
    assert [e["kind"] for e in events] == ["queued", "cancelled"]
    again = run("jobs", "cancel", job["id"])
    assert again.exit_code == 1
    assert "Conflict (409): the job is already cancelled" in again.stderr
    assert "/problems/job-not-cancellable" in again.stderr


def test_submit_wait_watch_and_download(run: Run, dataset_id: str, dispatcher: WorkerThreads, tmp_path: Path) -> None:
    dispatcher.run = True
    done = run("jobs", "submit", "--dataset", dataset_id, *TINY, "--wait", "--sse", "--interval", "0.05", "--json")
    job = ok_json(done)
    assert job["status"] == "succeeded" and job["steps_run"] == 4
    assert "4/4 steps" in done.stderr.splitlines()[-1] and "ε spent" in done.stderr  # the live bar
    watched = run("jobs", "watch", job["id"], "--interval", "0.05")
    assert watched.exit_code == 0 and "succeeded" in watched.stdout and "4/4 steps" in watched.stderr

    out = tmp_path / "artifacts"
    files = ok_json(run("jobs", "download", job["id"], "--out", str(out), "--json"))
    report = json.loads(Path(files["report"]).read_text())
    assert (
        report["epsilon"]["ledger"] == pytest.approx(job["epsilon_ledger"])
        and files["guarantee"] == report["guarantee"]
    )
    model = Path(files["model"])
    assert model == out / f"{job['id']}.safetensors"
    assert hashlib.sha256(model.read_bytes()).hexdigest() == report["model"]["sha256"]


def test_watch_times_out_and_exits_1_when_the_job_did_not_succeed(run: Run, dataset_id: str) -> None:
    job = ok_json(run("jobs", "submit", "--dataset", dataset_id, *TINY, "--json"))  # nobody runs it
    timed_out = run("jobs", "watch", job["id"], "--timeout", "0.1", "--interval", "0.02", "-q")
    assert timed_out.exit_code == 1 and "still queued" in timed_out.stderr
    run("jobs", "cancel", job["id"])
    watched = run("jobs", "watch", job["id"], "--quiet", "--json")
    assert watched.exit_code == 1 and json.loads(watched.stdout)["status"] == "cancelled"
    assert f"job {job['id']} cancelled" in watched.stderr


def test_api_errors_exit_1_with_the_problem_on_stderr(run: Run, dataset_id: str) -> None:
    missing = run("datasets", "show", "ds_missing")
    assert missing.exit_code == 1 and missing.stdout == ""
    assert "Error: Not Found (404): dataset not found" in missing.stderr and "/problems/not-found" in missing.stderr
    as_json = run("jobs", "show", "job_missing", "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stderr)["type"] == "/problems/not-found"

    invalid = run("jobs", "estimate", "--dataset", dataset_id, *TINY, "--hyper", "clipping_norm=-1")
    assert invalid.exit_code == 1 and "/problems/invalid-job-spec" in invalid.stderr
    unknown = run("jobs", "submit", "--dataset", dataset_id, *TINY, "--hyper", "clip=1")
    assert unknown.exit_code == 1 and "invalid-job-spec" in unknown.stderr
    incomplete = run("jobs", "submit", "--dataset", dataset_id, "--model", "mlp")
    assert incomplete.exit_code == 1 and "/problems/validation-error" in incomplete.stderr
    assert "algorithm.name" in incomplete.stderr  # the failing field, from the problem's errors
    assert ok_json(run("jobs", "list", "--json")) == []
    over = run("jobs", "submit", "--dataset", dataset_id, *ALGORITHM, "--noise-multiplier", "0.3", *TINY_TRAINING)
    assert over.exit_code == 1 and "insufficient-privacy-budget" in over.stderr and "remaining_epsilon" in over.stderr
    bad_key = run("datasets", "list", env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": "pt_nope"})
    assert bad_key.exit_code == 1 and "Unauthorized (401)" in bad_key.stderr


def test_usage_errors_exit_2(run: Run, dataset_id: str, tmp_path: Path) -> None:
    assert run("datasets", "list", env={"PRIVTRAIN_URL": BASE_URL}).exit_code == 2  # no key
    assert run("jobs", "estimate").exit_code == 2  # no spec at all
    bad_hyper = run("jobs", "estimate", "--dataset", dataset_id, *TINY, "--hyper", "momentum")
    assert bad_hyper.exit_code == 2 and "key=value" in bad_hyper.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("dataset_id: [\n")
    bad_file = run("jobs", "submit", "--spec", str(broken))
    assert bad_file.exit_code == 2 and "not valid YAML" in bad_file.stderr
    assert run("datasets", "upload", str(tmp_path / "nope.csv"), "--epsilon", "1", "--delta", "1e-5").exit_code == 2
    odd = tmp_path / "data.parquet"
    odd.write_bytes(b"x")
    assert run("datasets", "upload", str(odd), "--epsilon", "1", "--delta", "1e-5").exit_code == 2
    assert run("jobs", "frobnicate").exit_code == 2


def test_url_and_key_flags_override_the_environment(run: Run, api_key: str) -> None:
    result = run("--url", BASE_URL, "--api-key", api_key, "--json", "models", env={"PRIVTRAIN_API_KEY": "pt_nope"})
    assert result.exit_code == 0 and json.loads(result.stdout)


def test_upload_declares_classes_and_a_second_upload_of_the_same_bytes_is_refused(run: Run, digits_path: Path) -> None:
    names = ",".join(f"digit-{i}" for i in range(10))
    shown = run("datasets", "upload", str(digits_path), "--epsilon", "8", "--delta", "1e-5", "--classes", names)
    assert shown.exit_code == 0, shown.stderr
    assert "10: digit-0, digit-1" in shown.stdout and "(declared)" in shown.stdout
    assert "note:" not in shown.stdout  # a declared list needs no notice
    again = run("datasets", "upload", str(digits_path), "--name", "copy", "--epsilon", "8", "--delta", "1e-5")
    assert again.exit_code == 1
    assert "/problems/dataset-already-registered" in again.stderr and "raise that dataset's budget" in again.stderr
    existing = json.loads(run("datasets", "list", "--json").stdout)[0]["id"]
    assert f"hint: privtrain datasets raise-budget {existing} --epsilon" in again.stderr


def test_upload_without_classes_says_the_observed_list_is_now_public(run: Run, digits_path: Path) -> None:
    shown = run("datasets", "upload", str(digits_path), "--epsilon", "8", "--delta", "1e-5")
    assert shown.exit_code == 0, shown.stderr
    assert "taken from the labels found" in shown.stdout
    assert "note: no class list was declared" in shown.stdout


def test_datasets_delete_asks_erases_and_the_same_rows_continue_the_ledger(
    run: Run, dataset_id: str, digits_path: Path, tmp_path: Path
) -> None:
    kept = run("datasets", "delete", dataset_id, input="n\n")
    assert kept.exit_code == 1 and "Delete dataset" in kept.stderr and "Aborted" in kept.stderr
    assert ok_json(run("datasets", "show", dataset_id, "--json"))["status"] == "active"

    deleted = ok_json(run("datasets", "delete", dataset_id, "--yes", "--delete-models", "--json"))
    assert deleted["status"] == "deleted" and deleted["deletion"]["models"] == "deleted"
    human = run("datasets", "show", dataset_id)
    assert human.exit_code == 0 and "status" in human.stdout and "deleted" in human.stdout
    assert dataset_id not in run("datasets", "list").stdout
    listed = ok_json(run("datasets", "list", "--include-deleted", "--json"))
    assert [(d["id"], d["status"]) for d in listed] == [(dataset_id, "deleted")]
    assert "deleted" in run("datasets", "list", "--include-deleted").stdout  # the STATUS column
    assert ok_json(run("datasets", "delete", dataset_id, "--yes", "--json"))["status"] == "deleted"  # idempotent

    crlf = tmp_path / "digits-crlf.csv"
    crlf.write_bytes(digits_path.read_bytes().replace(b"\n", b"\r\n"))
    again = run("datasets", "upload", str(crlf), "--epsilon", "8", "--delta", "1e-5")
    assert again.exit_code == 0, again.stderr
    assert dataset_id in again.stdout and "note: these rows were registered before" in again.stdout
    assert "its ledger continues" in again.stdout


def test_datasets_delete_is_refused_to_an_analyst(run: Run, dataset_id: str, database: Database) -> None:
    bob = new_key(database, "bob")
    assert ok_json(run("datasets", "grant", dataset_id, "bob", "--json"))["status"] == "invited"
    as_bob = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": bob}
    assert run("invitations", "accept", dataset_id, env=as_bob).exit_code == 0
    refused = run("datasets", "delete", dataset_id, "--yes", env=as_bob)
    assert refused.exit_code == 1 and "/problems/forbidden" in refused.stderr
