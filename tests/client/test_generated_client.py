"""A client generated from the service's own OpenAPI document works: openapi-python-client builds it
from ``/openapi.json`` (nothing hand-written), and it uploads a dataset, estimates, submits, polls,
and downloads the model and the report, against the in-process service with a worker."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, tiny_spec

GENERATOR = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))


@pytest.fixture
def generated(transport: AppTransport, tmp_path: Path) -> Any:
    """The generated package, imported from a temporary folder."""
    if GENERATOR is None:
        pytest.fail("openapi-python-client is a dev dependency: make venv installs it")
    spec = transport.app_client.get("/openapi.json").json()
    (tmp_path / "openapi.json").write_text(json.dumps(spec))
    (tmp_path / "config.yml").write_text("post_hooks: []\npackage_name_override: privtrain_generated\n")
    done = subprocess.run(
        [GENERATOR, "generate", "--path", "openapi.json", "--config", "config.yml", "--meta", "none"]
        + ["--output-path", "privtrain_generated"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("privtrain_generated")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.startswith("privtrain_generated")]:
            del sys.modules[name]


def test_a_generated_client_runs_a_job_end_to_end(
    generated: Any, transport: AppTransport, api_key: str, dispatcher: WorkerThreads, digits_csv: bytes
) -> None:
    from privtrain_generated.api.datasets import upload_dataset_v1_datasets_post as upload
    from privtrain_generated.api.jobs import (
        download_model_v1_jobs_job_id_model_get as download_model,
    )
    from privtrain_generated.api.jobs import (
        download_report_v1_jobs_job_id_report_get as download_report,
    )
    from privtrain_generated.api.jobs import estimate_v1_jobs_estimate_post as estimate
    from privtrain_generated.api.jobs import get_job_v1_jobs_job_id_get as get_job
    from privtrain_generated.api.jobs import submit_v1_jobs_post as submit
    from privtrain_generated.models import DatasetOut, JobCreate, JobOut, PrivacyEstimate
    from privtrain_generated.types import File

    dispatcher.run = True
    client = generated.AuthenticatedClient(base_url=BASE_URL, token=api_key, httpx_args={"transport": transport})
    dataset = upload.sync(
        client=client,
        body=File(payload=digits_csv, file_name="digits.csv", mime_type="application/octet-stream"),
        name="digits",
        format_="csv",
        label_column="label",
        epsilon=8.0,
        delta=1e-5,
    )
    assert isinstance(dataset, DatasetOut), dataset
    spec = JobCreate.from_dict(tiny_spec(dataset.id))
    priced = estimate.sync(client=client, body=spec)
    assert isinstance(priced, PrivacyEstimate) and priced.admissible, priced
    job = submit.sync(client=client, body=spec)
    assert isinstance(job, JobOut), job
    deadline = time.monotonic() + 120
    while job.status not in {"succeeded", "failed", "cancelled"} and time.monotonic() < deadline:
        time.sleep(0.1)
        job = get_job.sync(job.id, client=client)
    assert job.status == "succeeded", (job.status, dispatcher.outcomes)
    assert job.epsilon_basis == "committed" and job.epsilon == pytest.approx(priced.epsilon_reserved, rel=1e-9)
    model = download_model.sync_detailed(job.id, client=client)
    assert model.status_code == 200 and model.content[8:9] == b"{"  # a safetensors header follows its length
    report = download_report.sync_detailed(job.id, client=client)
    assert report.status_code == 200 and json.loads(report.content)["job_id"] == job.id
    refused = get_job.sync("job_none", client=client)
    assert refused is not None and getattr(refused, "type_", None) == "/problems/not-found"
