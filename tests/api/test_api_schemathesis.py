"""Schemathesis against the app's own OpenAPI schema: no 5xx, responses match the schema.

Bounded (`max_examples` per operation) so CI stays fast. Requests carry a valid API key for a
tenant that owns a real dataset and a queued job, so the generated cases reach the handlers
(not just the 401 path); random ids answer 404 problems, which must match the schema too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from app.bootstrap import migrate
from app.db import Database
from app.main import create_app
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key, to_csv

MAX_EXAMPLES = 25
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, dict[str, str]]]:
    from fastapi.testclient import TestClient
    import numpy as np

    data_dir: Path = tmp_path_factory.mktemp("schemathesis") / "data"
    app_settings = make_settings(data_dir, max_upload_bytes=200_000, sse_max_stream_s=0.2,
                                 sse_poll_interval_s=0.05, sse_keepalive_s=0.1)
    migrate(app_settings)
    database = Database(app_settings.resolved_database_url)
    headers = {"Authorization": f"Bearer {new_key(database, 'fuzz')}"}
    app = create_app(app_settings, dispatcher=RecordingDispatcher())
    rng = np.random.default_rng(0)
    body = to_csv(rng.random((200, 4)), rng.integers(0, 2, 200))
    with TestClient(app) as client:  # a real dataset and job to hang generated requests on
        dataset = client.post("/v1/datasets", headers=headers, content=body, params={
            "name": "fuzz", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5})
        assert dataset.status_code == 201, dataset.text
        job = client.post("/v1/jobs", headers=headers, json=dp_sgd_spec(dataset.json()["id"]))
        assert job.status_code == 202, job.text
        yield app, headers
    database.dispose()


@pytest.mark.timeout(600)
def test_no_server_errors_and_schema_conformance(api: tuple[object, dict[str, str]]) -> None:
    """Every operation of the schema, MAX_EXAMPLES generated cases each, all checks passing."""
    app, headers = api
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    executed: dict[str, int] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def exercise(case: schemathesis.Case) -> None:
            executed[operation.label] = executed.get(operation.label, 0) + 1
            try:
                case.call_and_validate(headers=headers, checks=CHECKS)
            except (Exception, BaseExceptionGroup) as exc:  # collect every failing operation
                failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:400]}")
                raise

        try:
            exercise()
        except (Exception, BaseExceptionGroup):
            pass  # recorded in `failures` above
    total = sum(executed.values())
    print(f"schemathesis: {total} cases over {len(executed)} operations")
    assert not failures, "\n".join(failures[:10])
    assert len(executed) >= 15 and total >= 150
