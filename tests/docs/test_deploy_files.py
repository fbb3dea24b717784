"""The deployment files hold together: every Kubernetes manifest validates against the API
schemas (strict: no unknown fields), the worker classes consume the queues the service routes to,
and no compose service shares a volume with another (only PostgreSQL, Redis and the store are
shared, as on separate hosts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kernel.config import Settings

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_valid_kubernetes(path: Path) -> None:
    for document in _documents(path):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def _by_kind() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in MANIFESTS:
        for document in _documents(path):
            found[document["kind"], document["metadata"]["name"]] = document
    return found


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item["value"] for item in container.get("env", [])}


def test_worker_classes_cover_the_queues_and_gpus_are_requested() -> None:
    manifests = _by_kind()
    config = manifests["ConfigMap", "privtrain-config"]["data"]
    settings = Settings(
        **{
            key.removeprefix("PRIVTRAIN_").lower(): value
            for key, value in config.items()
            if key.startswith("PRIVTRAIN_")
        }
    )  # type: ignore[arg-type]
    gpu = manifests["Deployment", "privtrain-worker-gpu"]
    cpu = manifests["Deployment", "privtrain-worker-cpu"]
    consumed = {queue for deployment in (gpu, cpu) for queue in _env(deployment)["PRIVTRAIN_WORKER_QUEUES"].split(",")}
    assert consumed == set(settings.queue_names) == {settings.task_queue, settings.cpu_queue}
    gpu_limits = gpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert gpu_limits["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in cpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert settings.storage_url is not None and settings.storage_url.startswith("s3://")


def test_compose_services_share_no_volume_and_use_the_object_store() -> None:
    for name in ("docker-compose.yml", "docker-compose.worker-host.yml"):
        compose = yaml.safe_load((ROOT / name).read_text())
        owners: dict[str, str] = {}
        for service, body in compose["services"].items():
            for volume in body.get("volumes", []):
                source = volume.split(":", 1)[0]
                assert source not in owners, f"{name}: {service} and {owners[source]} share {source}"
                owners[source] = service
        workers = [body for service, body in compose["services"].items() if service.startswith("worker")]
        assert workers
        for worker in workers:
            environment = worker["environment"]
            merged = {**compose.get("x-privtrain-env", {}), **environment} if isinstance(environment, dict) else {}
            assert str(merged.get("PRIVTRAIN_STORAGE_URL", "")).startswith("s3://"), name
