"""Jobs go to the queue they name, else to the CPU or GPU queue by their model's size; a queue the
service does not offer is refused before anything is stored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from click.testing import CliRunner
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.jobs.planning import FIELDS_ADDED_LATER, request_hash
from kernel.schemas.jobs import JobCreate
from privtrain.cli import CliEnvironment, cli
from privtrain.specs import build_job_spec
from tests.client.conftest import BASE_URL, AppTransport, api_key, transport  # noqa: F401
from tests.conftest import RecordingDispatcher, counts, dp_sgd_spec, make_settings, new_key, upload


def test_jobs_are_routed_by_size_or_by_the_queue_they_name(tmp_path: Path, digits_csv: bytes) -> None:
    settings = make_settings(tmp_path / "data", queues="gpu-h100,gpu,cpu", cpu_job_max_parameters=10_000)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    dispatcher = RecordingDispatcher()
    with TestClient(create_app(settings, dispatcher=dispatcher)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(database, 'alice')}"
        dataset = upload(client, digits_csv).json()["id"]
        small = dp_sgd_spec(dataset)  # logistic regression on 64 features: 650 parameters
        large = {**dp_sgd_spec(dataset), "model": {"name": "mlp", "params": {"hidden_sizes": [256]}}}  # 19,210
        named = {**small, "resources": {"queue": "gpu-h100"}}
        routed = {}
        for label, spec in (("small", small), ("large", large), ("named", named)):
            response = client.post("/v1/jobs", json=spec)
            assert response.status_code == 202, response.text
            routed[label] = response.json()
            assert dispatcher.queues[routed[label]["id"]] == routed[label]["queue"]
        assert {label: job["queue"] for label, job in routed.items()} == {
            "small": "cpu",
            "large": "gpu",
            "named": "gpu-h100",
        }
        assert client.get(f"/v1/jobs/{routed['large']['id']}").json()["queue"] == "gpu"

        before = counts(database)
        for endpoint in ("/v1/jobs/estimate", "/v1/jobs"):
            refused = client.post(endpoint, json={**small, "resources": {"queue": "tpu"}})
            assert refused.status_code == 422, refused.text
            assert refused.json()["type"] == "/problems/unknown-queue"
            assert "gpu-h100, gpu, cpu" in refused.json()["detail"]
        bad_name = client.post("/v1/jobs", json={**small, "resources": {"queue": "GPU H100"}})
        assert bad_name.status_code == 422
        assert counts(database) == before  # nothing stored, nothing reserved
    database.dispose()


def test_resources_enter_the_idempotency_digest_only_when_set() -> None:
    spec = dp_sgd_spec("ds_0123456789abcdef01234567")
    body = JobCreate.model_validate(spec).model_dump(mode="json")
    body.pop("resources")
    for section, field in FIELDS_ADDED_LATER:
        if body.get(section) is not None and body[section].get(field) is None:
            body[section].pop(field, None)
    before_queues = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert request_hash(JobCreate.model_validate(spec)) == before_queues  # an old key's retry still matches
    named = JobCreate.model_validate({**spec, "resources": {"queue": "gpu"}})
    assert request_hash(named) != before_queues


def test_the_cli_sends_the_queue() -> None:
    spec = build_job_spec(dataset_id="ds_x", model="mlp", algorithm="dp-sgd", steps=3, queue="gpu-h100")
    assert spec["resources"] == {"queue": "gpu-h100"}
    assert "resources" not in build_job_spec(dataset_id="ds_x", model="mlp", algorithm="dp-sgd", steps=3)
    result = CliRunner().invoke(cli, ["jobs", "submit", "--help"])
    assert "--queue" in result.output


def test_the_cli_shows_a_jobs_queue(
    alice: TestClient,
    transport: AppTransport,  # noqa: F811
    api_key: str,  # noqa: F811
    digits_csv: bytes,
) -> None:
    dataset = upload(alice, digits_csv).json()["id"]
    job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset)).json()["id"]
    env = {"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": api_key}
    shown = CliRunner().invoke(cli, ["jobs", "show", job], obj=CliEnvironment(transport=transport), env=env)
    assert shown.exit_code == 0, shown.output
    assert any(line.split()[:2] == ["queue", "cpu"] for line in shown.stdout.splitlines()), shown.stdout
