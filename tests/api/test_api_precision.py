"""``training.precision`` through the API, the CLI and the worker's JobRunner: a bf16 job costs
exactly what the fp32 one costs, trains its forward under bf16 autocast, and its report and model
config say so; algorithms without a bf16 trainer refuse it before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.jobs.planning import request_hash
from kernel.schemas.jobs import JobCreate
from privtrain.cli import CliEnvironment, cli
from privtrain.specs import build_job_spec
from privtrain_common.model_files import load_model
from tests.api.worker_jobs import run_on_worker, upload_shapes
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.conftest import counts


def _spec(dataset_id: str, *, algorithm: str = "dp-sgd", precision: str | None = "bf16") -> dict[str, Any]:
    spec = build_job_spec(
        dataset_id=dataset_id,
        model="cnn2-gn",
        algorithm=algorithm,
        steps=3,
        batch_size=8,
        learning_rate=0.5,
        hyperparameters={"clipping_norm": 1.0} if algorithm == "dp-sgd" else {},
        target_epsilon=None if algorithm in ("sgd", "adam") else 2.0,
        precision=precision,
    )
    return spec


@contextmanager
def _autocasts() -> Iterator[list[tuple[str, torch.dtype]]]:
    """(device type, dtype) of every autocast region entered while training."""
    entered: list[tuple[str, torch.dtype]] = []
    real = torch.autocast

    def record(device_type: str, dtype: torch.dtype | None = None, **options: Any) -> torch.autocast:
        assert dtype is not None
        entered.append((device_type, dtype))
        return real(device_type, dtype=dtype, **options)

    with mock.patch("torch.autocast", side_effect=record):
        yield entered


def test_a_bf16_dp_sgd_job_costs_the_same_and_trains_under_bf16_autocast(
    alice: TestClient, settings: Settings, database: Database, tmp_path: Path
) -> None:
    dataset_id = upload_shapes(alice)
    bf16, fp32 = _spec(dataset_id), _spec(dataset_id, precision=None)
    price = alice.post("/v1/jobs/estimate", json=bf16).json()
    plain = alice.post("/v1/jobs/estimate", json=fp32).json()
    for field in ("noise_multiplier", "sampling_probability", "steps", "epsilon_ledger", "epsilon_prv"):
        assert price[field] == plain[field], field

    with _autocasts() as entered:
        job_id = run_on_worker(alice, settings, database, bf16)
    assert entered and set(entered) == {("cpu", torch.bfloat16)}
    execution = alice.get(f"/v1/jobs/{job_id}/report").json()["execution"]
    assert execution["precision"] == "bf16" and "in bf16" in execution["statement"]
    model_file = tmp_path / "model.safetensors"
    model_file.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    loaded = load_model(model_file)
    assert loaded.config["precision"] == "bf16"
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())  # released weights stay fp32

    with _autocasts() as entered:
        plain_job = run_on_worker(alice, settings, database, fp32)
    assert entered == []  # fp32 never enters autocast
    assert alice.get(f"/v1/jobs/{plain_job}/report").json()["execution"]["precision"] == "fp32"


def test_a_non_private_job_on_public_images_trains_under_bf16(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = upload_shapes(alice, public="true")
    with _autocasts() as entered:
        job_id = run_on_worker(alice, settings, database, _spec(dataset_id, algorithm="sgd"))
    assert entered == [("cpu", torch.bfloat16)] * 3  # one forward per step
    assert alice.get(f"/v1/jobs/{job_id}/report").json()["execution"]["precision"] == "bf16"


def test_an_algorithm_without_a_bf16_trainer_refuses_it(alice: TestClient, database: Database) -> None:
    dataset_id = upload_shapes(alice)
    before = counts(database)
    response = alice.post("/v1/jobs", json=_spec(dataset_id, algorithm="dicesgd"))
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("training.precision: dicesgd computes in float32")
    fp16 = _spec(dataset_id)
    fp16["training"]["precision"] = "fp16"
    assert alice.post("/v1/jobs/estimate", json=fp16).status_code == 422
    assert counts(database) == before


def test_precision_is_part_of_the_idempotency_digest_only_when_set() -> None:
    dataset_id = "ds_0123456789abcdef01234567"
    digests = {request_hash(JobCreate.model_validate(_spec(dataset_id, precision=p))) for p in (None, "fp32", "bf16")}
    assert len(digests) == 3
    unset = JobCreate.model_validate(_spec(dataset_id, precision=None)).model_dump(mode="json")
    assert "precision" in unset["training"]  # the schema has it; the digest leaves it out while unset


def test_the_cli_sends_precision(alice: TestClient, transport: AppTransport, api_key: str) -> None:  # noqa: F811
    dataset_id = upload_shapes(alice)
    args = ["jobs", "estimate", "--dataset", dataset_id, "--model", "cnn2-gn", "--target-epsilon", "2"]
    args += ["--steps", "3", "--batch-size", "8", "--lr", "0.5", "--precision", "bf16", "--json"]
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key}
    for algorithm, answer in (("dp-sgd", '"steps": 3'), ("dicesgd", "dicesgd computes in float32")):
        result = CliRunner().invoke(
            cli, [*args, "--algorithm", algorithm], obj=CliEnvironment(transport=transport), env=env
        )
        assert answer in result.stdout + result.stderr, (result.stdout, result.stderr)
