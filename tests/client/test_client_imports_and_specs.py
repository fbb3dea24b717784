"""The client stays torch-free and server-free; job specs from kwargs, files and flag overrides;
the problem-type registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from privtrain import errors
from privtrain.specs import SpecFileError, SpecOverrides, build_job_spec, load_spec_file, merge_spec, parse_assignment

PROBE = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
import privtrain, privtrain.client, privtrain.cli
loaded = {m.split(".")[0] for m, module in sys.modules.items() if module is not None}
heavy = sorted(loaded & {"torch", "kernel", "api", "worker", "numpy", "sqlalchemy", "fastapi", "yaml"})
print(",".join(heavy))
"""


def test_the_client_and_cli_import_without_torch_or_the_server() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_every_problem_type_the_api_documents_has_a_class() -> None:
    expected = {
        "not-found": errors.NotFound,
        "validation-error": errors.InvalidRequest,
        "invalid-job-spec": errors.InvalidRequest,
        "unknown-algorithm": errors.InvalidRequest,
        "insufficient-privacy-budget": errors.BudgetExceeded,
        "idempotency-key-reused": errors.IdempotencyKeyReused,
        "job-not-cancellable": errors.Conflict,
        "job-not-succeeded": errors.Conflict,
        "unauthorized": errors.Unauthorized,
        "payload-too-large": errors.PayloadTooLarge,
        "parse-deadline-exceeded": errors.PayloadTooLarge,
        "internal-error": errors.ServerError,
    }
    registry = errors.registered_problem_types()
    assert {slug: registry[slug] for slug in expected} == expected
    made = errors.error_for(
        409,
        {
            "type": "/problems/insufficient-privacy-budget",
            "title": "Conflict",
            "status": 409,
            "detail": "no",
            "remaining_epsilon": 0.25,
        },
    )
    assert isinstance(made, errors.BudgetExceeded) and made.remaining_epsilon == 0.25
    assert made.extra == {"remaining_epsilon": 0.25}
    # an unknown slug falls back by status; a non-JSON body by status too
    assert type(errors.error_for(404, {"type": "/problems/new-thing", "title": "x", "detail": "y"})) is errors.NotFound
    assert type(errors.error_for(418, "teapot")) is errors.PrivtrainError


def test_overrides_win_and_exclusive_fields_replace_each_other() -> None:
    base = build_job_spec(
        dataset_id="ds_1",
        model="mlp",
        algorithm="dp-sgd",
        batch_size=64,
        learning_rate=0.1,
        epochs=2,
        target_epsilon=3,
        hyperparameters={"clipping_norm": 1.0, "momentum": 0.9},
    )
    merged = merge_spec(
        base,
        SpecOverrides(
            dataset_id="ds_2",
            noise_multiplier=1.5,
            steps=10,
            hyperparameters={"clipping_norm": 2.0},
            model_params={"hidden_sizes": [8]},
        ),
    )
    assert merged["dataset_id"] == "ds_2"
    assert merged["privacy"] == {"noise_multiplier": 1.5}
    assert merged["training"] == {"steps": 10, "batch_size": 64, "learning_rate": 0.1}
    assert merged["algorithm"]["hyperparameters"] == {"clipping_norm": 2.0, "momentum": 0.9}
    assert merged["model"] == {"name": "mlp", "params": {"hidden_sizes": [8]}}
    assert base["privacy"] == {"target_epsilon": 3}  # the base is not modified


def test_a_full_batch_spec_leaves_batch_size_and_learning_rate_out() -> None:
    """kl-spider and the other full-batch / single-pass algorithms refuse both fields."""
    spec = build_job_spec(
        dataset_id="ds_1", model="linear-regression", algorithm="kl-spider", steps=40, target_epsilon=3
    )
    assert spec["training"] == {"steps": 40}


def test_spec_files_in_json_and_yaml(tmp_path: Path) -> None:
    spec = build_job_spec(
        dataset_id="ds_1", model="mlp", algorithm="dp-sgd", batch_size=64, learning_rate=0.1, epochs=2, target_epsilon=3
    )
    (tmp_path / "job.json").write_text(json.dumps(spec))
    (tmp_path / "job.yaml").write_text(
        "dataset_id: ds_1\nmodel: {name: mlp, params: {}}\nalgorithm: {name: dp-sgd, hyperparameters: {}}\n"
        "privacy: {target_epsilon: 3}\ntraining: {epochs: 2, batch_size: 64, learning_rate: 0.1}\n"
    )
    assert load_spec_file(tmp_path / "job.json") == spec == load_spec_file(tmp_path / "job.yaml")
    (tmp_path / "bad.yml").write_text("a: [1,\n")
    (tmp_path / "list.json").write_text("[1]")
    for name, message in (("bad.yml", "not valid YAML"), ("list.json", "mapping"), ("missing.json", "cannot read")):
        with pytest.raises(SpecFileError, match=message):
            load_spec_file(tmp_path / name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lr=0.5", ("lr", 0.5)),
        ("optimizer=adam", ("optimizer", "adam")),
        ("sizes=[8, 8]", ("sizes", [8, 8])),
        ("flag=true", ("flag", True)),
        ("name=a=b", ("name", "a=b")),
        (" k =1e-5", ("k", 1e-5)),
    ],
)
def test_assignments_read_json_values(text: str, expected: tuple) -> None:
    assert parse_assignment(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=3"])
def test_malformed_assignments_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_assignment(text)


def test_client_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from privtrain import Client

    monkeypatch.delenv("PRIVTRAIN_API_KEY", raising=False)
    with pytest.raises(ValueError, match="PRIVTRAIN_API_KEY"):
        Client.from_env()
    monkeypatch.setenv("PRIVTRAIN_API_KEY", "pt_x")
    monkeypatch.setenv("PRIVTRAIN_URL", "https://privtrain.example/")
    with Client.from_env() as client:
        assert client.base_url == "https://privtrain.example"
    monkeypatch.delenv("PRIVTRAIN_URL")
    with Client.from_env() as client:
        assert client.base_url == "http://127.0.0.1:8000"
