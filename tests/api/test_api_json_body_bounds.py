"""JSON request bodies are parsed within bounds (api/routes/json_body.py): nesting past 64 levels
or a number literal past 100 characters is a 422 ``validation-error`` naming the line and column,
never a 500 (a job's params nested 300 deep once broke pydantic's serializer) nor a bare 400."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry
from tests.conftest import dp_sgd_spec


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _post(client: TestClient, path: str, text: str) -> Any:
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


def _jobs_and_entries(database: Database) -> tuple[int, int]:
    with database.read_session() as session:
        return tuple(  # type: ignore[return-value]
            session.scalar(select(func.count()).select_from(table)) or 0 for table in (Job, LedgerEntry)
        )


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/jobs/estimate"])
def test_a_body_nested_past_64_levels_is_a_422_naming_where(
    alice: TestClient, database: Database, dataset_id: str, path: str
) -> None:
    spec = dp_sgd_spec(dataset_id)
    spec["model"] = {"name": "logistic-regression", "params": {"x": _nested(300)}}  # POST /v1/jobs: 500 before
    before = _jobs_and_entries(database)
    response = _post(alice, path, json.dumps(spec))
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/validation-error"
    assert "arrays and objects nested more than 64 levels deep at line 1" in problem["detail"]
    opened = json.dumps(spec).index("[")  # at level 4: inside the spec, model and params objects
    assert problem["position"]["character"] == opened + 64 - 3  # the bracket that opens level 65
    assert _jobs_and_entries(database) == before


def test_a_5000_digit_number_is_a_422_not_a_bare_400(alice: TestClient, dataset_id: str) -> None:
    text = json.dumps(dp_sgd_spec(dataset_id)).replace('"clipping_norm": 1.0', '"clipping_norm": ' + "7" * 5000)
    response = _post(alice, "/v1/jobs/estimate", text)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert "a number of more than 100 characters" in problem["detail"] and "7777" not in problem["detail"]
    assert problem["position"]["character"] == text.index("7777")


def test_within_the_bounds_a_body_is_read_as_before(alice: TestClient, dataset_id: str) -> None:
    """64 levels, a 100-character number and brackets inside strings are all still parsed: the
    answers are the model's and the budget's own validation, not the body bound."""
    spec = dp_sgd_spec(dataset_id)
    spec["model"] = {"name": "logistic-regression", "params": {"x": _nested(61)}}  # 64 with the spec's own
    deep = _post(alice, "/v1/jobs/estimate", json.dumps(spec))
    assert deep.status_code == 422 and deep.json()["type"] == "/problems/model-incompatible", deep.text
    number = "0." + "0" * 97 + "1"
    long = _post(alice, f"/v1/datasets/{dataset_id}/budget", '{"epsilon": 9, "delta": ' + number + "}")
    assert long.status_code == 422 and long.json()["type"] == "/problems/validation-error", long.text
    assert "nested" not in long.json()["detail"] and "number of more" not in long.json()["detail"]
    brackets = json.dumps({"epsilon": 9.5, "reason": "[" * 400 + "{" * 99})
    raised = _post(alice, f"/v1/datasets/{dataset_id}/budget", brackets)
    assert raised.status_code == 200, raised.text
