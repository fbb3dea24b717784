"""``training.augmult`` through the API and the worker's JobRunner: on an image dataset a DP-SGD job
(and a non-private one on public images) trains on K augmented views per sampled image at the same
price as without them, and its report says so; a dataset without images, and an algorithm without
a trainer for it, are refused before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
from click.testing import CliRunner
from fastapi.testclient import TestClient

from dp.data.augment import ViewDraws, augmented_views
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.jobs.planning import request_hash
from kernel.reporting.privacy_report import augmentation_section
from kernel.schemas.jobs import JobCreate
from privtrain.cli import CliEnvironment, cli
from privtrain.specs import SpecOverrides, build_job_spec, merge_spec
from tests.api.worker_jobs import run_on_worker, upload_shapes
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.conftest import counts, dp_sgd_spec, upload

VIEWS = 2


def _spec(dataset_id: str, *, algorithm: str = "dp-sgd", augmult: int | None = VIEWS) -> dict[str, Any]:
    training: dict[str, Any] = {"steps": 3, "batch_size": 8, "learning_rate": 0.5}
    if augmult is not None:
        training["augmult"] = augmult
    spec: dict[str, Any] = {
        "dataset_id": dataset_id,
        "model": {"name": "cnn2-gn", "params": {}},
        "algorithm": {"name": algorithm, "hyperparameters": {"clipping_norm": 1.0} if algorithm == "dp-sgd" else {}},
        "training": training,
    }
    if algorithm not in ("sgd", "adam"):
        spec["privacy"] = {"target_epsilon": 2.0}
    return spec


@contextmanager
def _recorded_views() -> Iterator[list[tuple[int, ...]]]:
    """The shape of every batch of views the worker trains on."""
    shapes: list[tuple[int, ...]] = []

    def record(images: torch.Tensor, draws: ViewDraws, *, padding: int) -> torch.Tensor:
        views = augmented_views(images, draws, padding=padding)
        shapes.append(tuple(views.shape))
        return views

    with mock.patch("dp.loop.augmult.augmented_views", side_effect=record):
        yield shapes


def test_a_dp_sgd_job_on_images_trains_on_views_at_the_same_price(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = upload_shapes(alice)
    with_views, plain = _spec(dataset_id), _spec(dataset_id, augmult=None)
    price = alice.post("/v1/jobs/estimate", json=with_views).json()
    plain_price = alice.post("/v1/jobs/estimate", json=plain).json()
    for field in ("noise_multiplier", "sampling_probability", "steps", "epsilon_ledger", "epsilon_prv"):
        assert price[field] == plain_price[field], field  # the sensitivity does not depend on K

    with _recorded_views() as shapes:
        job_id = run_on_worker(alice, settings, database, with_views)
    assert [shape[1:] for shape in shapes] == [(VIEWS, 1, 16, 16)] * 3  # every step's sampled images
    assert alice.get(f"/v1/jobs/{job_id}").json()["spec"]["training"]["augmult"] == VIEWS
    section = alice.get(f"/v1/jobs/{job_id}/report").json()["augmentation"]
    assert section["augmult"] == VIEWS and section["privacy_charge_depends_on_augmult"] is False
    assert "the charge is the same as with one view" in section["statement"]
    assert augmentation_section(None)["augmult"] == augmentation_section(1)["augmult"] == 1  # a plain job's


def test_a_non_private_job_on_public_images_trains_on_views(
    alice: TestClient, settings: Settings, database: Database
) -> None:
    dataset_id = upload_shapes(alice, public="true")
    with _recorded_views() as shapes:
        job_id = run_on_worker(alice, settings, database, _spec(dataset_id, algorithm="sgd"))
    assert shapes == [(8, VIEWS, 1, 16, 16)] * 3  # batch_size images per step, K views each
    section = alice.get(f"/v1/jobs/{job_id}/report").json()["augmentation"]
    assert section["augmult"] == VIEWS and "the loss is the mean over them" in section["statement"]


def test_a_dataset_without_images_is_refused_with_its_own_problem(
    alice: TestClient, database: Database, digits_csv: bytes
) -> None:
    dataset_id = upload(alice, digits_csv).json()["id"]
    spec = dp_sgd_spec(dataset_id)
    spec["training"] = {"steps": 3, "batch_size": 64, "learning_rate": 0.5, "augmult": VIEWS}
    before = counts(database)
    for path in ("/v1/jobs/estimate", "/v1/jobs"):
        response = alice.post(path, json=spec)
        assert response.status_code == 422, response.text
        assert response.json()["type"] == "/problems/augmult-needs-images"
        assert response.json()["detail"].startswith("training.augmult: augmentation multiplicity makes cropped")
    assert counts(database) == before


def test_an_algorithm_without_a_views_trainer_refuses_it(alice: TestClient, database: Database) -> None:
    spec = _spec(upload_shapes(alice), algorithm="dicesgd")
    before = counts(database)
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    assert response.json()["detail"].startswith("training.augmult: dicesgd trains on each sampled row as it is")
    assert counts(database) == before
    for too_many in (0, 33):
        assert alice.post("/v1/jobs/estimate", json=_spec(spec["dataset_id"], augmult=too_many)).status_code == 422


def test_augmult_is_part_of_the_idempotency_digest_only_when_set() -> None:
    spec = _spec("ds_0123456789abcdef01234567", augmult=None)
    assert "augmult" not in JobCreate.model_validate(spec).model_dump(exclude_none=True)["training"]
    digests = {request_hash(JobCreate.model_validate(_spec(spec["dataset_id"], augmult=k))) for k in (None, 2, 3)}
    assert len(digests) == 3
    unset = JobCreate.model_validate(spec)
    explicit_none = JobCreate.model_validate({**spec, "training": {**spec["training"], "augmult": None}})
    assert request_hash(unset) == request_hash(explicit_none)


def test_the_cli_sends_augmult(alice: TestClient, transport: AppTransport, api_key: str, digits_csv: bytes) -> None:  # noqa: F811
    args = ["--algorithm", "dp-sgd", "--model", "cnn2-gn", "--target-epsilon", "2", "--steps", "3"]
    args += ["--batch-size", "8", "--lr", "0.5", "--augmult", str(VIEWS), "--json"]
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key}
    for dataset_id, answer in (
        (upload_shapes(alice), '"steps": 3'),
        (upload(alice, digits_csv).json()["id"], "augmult-needs-images"),
    ):
        result = CliRunner().invoke(
            cli, ["jobs", "estimate", "--dataset", dataset_id, *args], obj=CliEnvironment(transport=transport), env=env
        )
        assert answer in result.stdout + result.stderr, (result.stdout, result.stderr)


def test_the_cli_flag_sets_training_augmult() -> None:
    spec = merge_spec({"training": {"steps": 3, "augmult": 2}}, SpecOverrides(augmult=8, steps=5))
    assert spec["training"] == {"steps": 5, "augmult": 8}
    assert merge_spec({"training": {"steps": 3, "augmult": 2}}, SpecOverrides())["training"]["augmult"] == 2
    built = build_job_spec(dataset_id="ds_x", model="cnn", algorithm="dp-sgd", steps=3, augmult=4)
    assert built["training"] == {"steps": 3, "augmult": 4}
