"""Schemathesis against the app's own OpenAPI schema: no 5xx, responses match the schema.

Bounded (`max_examples` per operation) so CI stays fast. Requests carry a valid API key for a
tenant that owns a real dataset and a queued job, so the generated cases reach the handlers
(not just the 401 path); random ids answer 404 problems, which must match the schema too.

A second pass overrides the generated values with the extremes that once answered 500 (issue 13):
numbers at 5e-324, 1e-300, 1e300, 2**70, -0.0 in any query parameter or JSON body field,
cursors that are base64 of crafted JSON arrays, hostile JSON documents (issue 36: nested
5,000 deep, 5,000-digit integers, NaN) in the query parameters that hold JSON text, and body
values nested 300 deep. It runs on
the generated cases and on valid request bodies (one per algorithm, with the fixture's real ids),
so an extreme reaches the privacy math behind the validation, not just the first schema check.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)

from api.main import create_app
from kernel.bootstrap import migrate
from kernel.db.engine import Database
from kernel.db.pagination import encode_cursor
from tests.conftest import (
    RecordingDispatcher,
    dp_sgd_spec,
    make_settings,
    new_key,
    spec_for,
    to_csv,
)

MAX_EXAMPLES = 25
EXTREME_EXAMPLES = 12
"""Per operation and per valid body in the extremes pass: ~500 cases, ~15 s on two cores."""
UPLOAD_EXAMPLES = 8
"""For the uploads, whose generated bodies are whole files to store and parse (each answered long
before a real file would be): fewer, as hostile uploads have tests of their own."""
UPLOADS = frozenset({"POST /v1/datasets", "POST /v1/base-models", "POST /v1/tokenizers"})
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]
ROWS, FEATURES = 200, 12  # 12 features: the sparse algorithms' default sparsity s = 10 fits

EXTREME_NUMBERS: Final[tuple[int | float, ...]] = (
    5e-324,
    -5e-324,
    1e-300,
    1e300,
    -1e300,
    2**70,
    -(2**70),
    2**63,
    -0.0,
    0,
)
"""Subnormal, tiny, huge, beyond int64, negative zero: each once answered a 500 somewhere."""


def _raw_cursor(payload: bytes) -> str:
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


CRAFTED_CURSORS: Final[tuple[str, ...]] = (
    *(
        encode_cursor(values)
        for values in (
            ["abc"],
            [2**70],
            [-(2**70)],
            [-1],
            [5e-324],
            [1e300],
            [-0.0],
            [True],
            [None],
            [],
            [[]],
            ["2020-01-01", {"x": 1}],
            ["2020-01-01", 2**70],
            ["2020-01-01", 5e-324],
            [1e300, "ds_x"],
            ["0001-01-01T00:00:00+14:00", "ds_x"],
            ["9999-12-31T23:59:59-14:00", "ds_x"],
            ["2020-01-01", "ds_\u0000"],
        )
    ),
    _raw_cursor(b"[" * 900),
    _raw_cursor(b"[1e999]"),
    _raw_cursor(b"[NaN]"),
    _raw_cursor(b"\xff\xfe"),
    "!!",
    "A" * 5000,
)
"""Cursors are opaque base64 JSON: a client can send any array, or no valid base64 at all."""

JSON_QUERY_PARAMETERS: Final[tuple[str, ...]] = ("params", "preparation")
"""Query parameters whose value is JSON text (base-model params, a dataset's preparation)."""

HOSTILE_JSON: Final[tuple[str, ...]] = (
    "[" * 5000 + "]" * 5000,
    '{"hidden_sizes": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"a": ' + "1" * 5000 + "}",
    '{"hidden_sizes": [' + "9" * 4301 + "]}",
    "[1e999]",
    '{"a": NaN}',
    '{"a": ' + "[" * 40 + "]" * 40 + "}",
    '"\\ud800"',
    "{",
)
"""JSON that once answered 500 (issue 36): nesting past Python's recursion limit, integers past its
4,300-digit limit, non-finite numbers, and a few near misses."""


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


DEEP_VALUE: Final = _nested(300)
"""A body value nested 300 deep: parsed by json, it once broke pydantic's serializer (a 500)."""


@dataclass(frozen=True)
class FuzzApi:
    app: object
    headers: dict[str, str]
    path_ids: dict[str, str]
    """Real ids for path parameters, so generated cases reach the handlers, not the 404 path."""
    bodies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Valid JSON bodies per operation label (each answered 2xx once)."""


def _job_bodies(client: Any, headers: dict[str, str], *, classification: str, regression: str) -> list[dict[str, Any]]:
    """One valid estimate body per algorithm (its defaults), plus the DP-SGD variants with every
    optional privacy number (δ, σ, a Gaussian or Laplace evaluation). Full batches (q = 1) keep
    each valid call cheap: the subsampled RDP series is what costs seconds."""
    catalogue = client.get("/v1/algorithms", headers=headers).json()
    items = catalogue["items"] if isinstance(catalogue, dict) else catalogue
    names = [a["name"] for a in items if a.get("private", True)]  # sgd/adam: public datasets only
    bodies: list[dict[str, Any]] = []
    for name in names:
        entry = client.get(f"/v1/algorithms/{name}", headers=headers).json()
        reads = set(entry["training_fields"])
        for dataset_id, model in ((classification, "logistic-regression"), (regression, "linear-regression")):
            body = spec_for(dataset_id, name, dict(entry["defaults"]), target_epsilon=4.0)
            body["model"]["name"] = model
            body["training"] = {
                "epochs": 1,
                **{k: v for k, v in (("batch_size", ROWS), ("learning_rate", 0.5)) if k in reads},
            }
            if client.post("/v1/jobs/estimate", headers=headers, json=body).status_code == 200:
                bodies.append(body)
                break
    assert len(bodies) >= len(names) - 1, "most algorithms must have a valid body to mutate"
    base = dp_sgd_spec(classification, noise_multiplier=1.0, delta=1e-6)
    base["training"] = {"steps": 3, "batch_size": ROWS, "learning_rate": 0.5, "time_limit_s": 60.0}
    held_out = {**base, "training": {**base["training"], "batch_size": ROWS * 9 // 10}}  # the rest trains
    gaussian = {**held_out, "evaluation": {"holdout_fraction": 0.1, "mechanism": "gaussian", "noise_multiplier": 1.0}}
    laplace = {**held_out, "evaluation": {"holdout_fraction": 0.1, "mechanism": "laplace", "epsilon": 0.5}}
    for body in (base, gaussian, laplace):
        response = client.post("/v1/jobs/estimate", headers=headers, json=body)
        assert response.status_code == 200, response.text
        bodies.append(body)
    return bodies


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzApi]:
    import numpy as np
    from fastapi.testclient import TestClient

    data_dir: Path = tmp_path_factory.mktemp("schemathesis") / "data"
    app_settings = make_settings(
        data_dir, max_upload_bytes=200_000, sse_max_stream_s=0.2, sse_poll_interval_s=0.05, sse_keepalive_s=0.1
    )
    migrate(app_settings)
    database = Database(app_settings.resolved_database_url)
    headers = {"Authorization": f"Bearer {new_key(database, 'fuzz')}"}
    app = create_app(app_settings, dispatcher=RecordingDispatcher())
    rng = np.random.default_rng(0)
    query = {"format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    with TestClient(app) as client:  # real datasets and a job to hang generated requests on
        dataset = client.post(
            "/v1/datasets",
            headers=headers,
            params={"name": "fuzz", **query},
            content=to_csv(rng.random((ROWS, FEATURES)), rng.integers(0, 2, ROWS)),
        )
        assert dataset.status_code == 201, dataset.text
        regression = client.post(
            "/v1/datasets",
            headers=headers,
            params={"name": "reg", "task": "regression", **query},
            content=to_csv(rng.random((ROWS, FEATURES)), rng.random(ROWS)),
        )
        assert regression.status_code == 201, regression.text
        dataset_id = dataset.json()["id"]
        job = client.post("/v1/jobs", headers=headers, json=dp_sgd_spec(dataset_id))
        assert job.status_code == 202, job.text
        job_bodies = _job_bodies(client, headers, classification=dataset_id, regression=regression.json()["id"])
        yield FuzzApi(
            app=app,
            headers=headers,
            path_ids={"dataset_id": dataset_id, "job_id": job.json()["id"]},
            bodies={
                "POST /v1/jobs/estimate": job_bodies,
                "POST /v1/jobs": job_bodies[-3:],
                "POST /v1/datasets/{dataset_id}/budget": [{"epsilon": 9.0, "delta": 1e-4, "reason": "fuzz"}],
            },
        )
    database.dispose()


def _fuzz_operation(
    operation: schemathesis.APIOperation,
    *,
    headers: dict[str, str],
    executed: dict[str, int],
    failures: list[str],
) -> None:
    """MAX_EXAMPLES generated cases of one operation; failures are recorded, so the caller goes on
    to the next operation and reports them all at once."""

    @given(case=operation.as_strategy())
    @settings(
        max_examples=UPLOAD_EXAMPLES if operation.label in UPLOADS else MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case: schemathesis.Case) -> None:
        executed[operation.label] = executed.get(operation.label, 0) + 1
        try:
            case.call_and_validate(headers=headers, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as exc:  # collect every failing operation
            failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:400]}")
            raise

    with contextlib.suppress(Exception, BaseExceptionGroup):  # recorded in `failures` by `exercise`
        exercise()


@pytest.mark.timeout(600)
def test_no_server_errors_and_schema_conformance(api: FuzzApi) -> None:
    """Every operation of the schema, MAX_EXAMPLES generated cases each, all checks passing."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    executed: dict[str, int] = {}
    failures: list[str] = []
    for result in schema.get_all_operations():
        _fuzz_operation(result.ok(), headers=api.headers, executed=executed, failures=failures)
    total = sum(executed.values())
    print(f"schemathesis: {total} cases over {len(executed)} operations")
    assert not failures, "\n".join(failures[:10])
    assert len(executed) >= 15 and total >= 150


# ------------------------------------------------------------------------------ extremes pass


def _numeric_slots(value: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every number (not bool) in a JSON value, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    slots: list[tuple[Any, Any]] = []
    for key, item in items:
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            slots.append((value, key))
        else:
            slots.extend(_numeric_slots(item))
    return slots


def _is_numeric(schema: Any) -> bool:
    if not isinstance(schema, dict):
        return False
    return schema.get("type") in ("integer", "number") or any(_is_numeric(s) for s in schema.get("anyOf", ()))


@dataclass(frozen=True)
class _QueryShape:
    numeric: tuple[str, ...]
    """Numeric query parameters, optional ones included: the extreme goes there even when the
    generated case left them out."""
    cursor: bool
    json_text: tuple[str, ...] = ()
    """Query parameters holding JSON text: a hostile document goes there."""


def _query_shape(operation: Any) -> _QueryShape:
    parameters = [(p.name, p.definition.get("schema")) for p in operation.query]
    return _QueryShape(
        numeric=tuple(name for name, schema in parameters if _is_numeric(schema)),
        cursor=any(name == "cursor" for name, _ in parameters),
        json_text=tuple(name for name, _ in parameters if name in JSON_QUERY_PARAMETERS),
    )


def _with_extremes(case: schemathesis.Case, data: st.DataObject, shape: _QueryShape) -> None:
    """One number of the case (a numeric query parameter or a JSON body number) set to an extreme;
    a crafted cursor where the operation takes one."""
    query = dict(case.query or {})
    slots: list[tuple[Any, Any]] = [(query, name) for name in shape.numeric]
    if isinstance(case.body, (dict, list)):
        slots += _numeric_slots(case.body)
    if slots:
        container, key = data.draw(st.sampled_from(slots), label="field")
        container[key] = data.draw(st.sampled_from(EXTREME_NUMBERS), label="extreme")
    body_slots = _numeric_slots(case.body) if isinstance(case.body, (dict, list)) else []
    if body_slots and data.draw(st.integers(0, 3), label="deep") == 0:  # a body nested past the bound
        case.body = copy.deepcopy(case.body)  # a valid body is shared by its examples: keep its shape
        container, key = data.draw(st.sampled_from(_numeric_slots(case.body)), label="deep field")
        container[key] = DEEP_VALUE
    if shape.cursor:
        query["cursor"] = data.draw(st.sampled_from(CRAFTED_CURSORS), label="cursor")
    for name in shape.json_text:
        if data.draw(st.booleans(), label=f"hostile {name}"):  # else the numbers reach past it
            query[name] = data.draw(st.sampled_from(HOSTILE_JSON), label=name)
    case.query = query


@dataclass
class _Tally:
    executed: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _exercise_with_extremes(api: FuzzApi, operation: Any, strategy: Any, tally: _Tally) -> None:
    """EXTREME_EXAMPLES cases of ``strategy``, each given extremes; every failure is recorded."""
    shape = _query_shape(operation)

    @given(case=strategy, data=st.data())
    @settings(
        max_examples=EXTREME_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case: schemathesis.Case, data: st.DataObject) -> None:
        _with_extremes(case, data, shape)
        tally.executed[operation.label] = tally.executed.get(operation.label, 0) + 1
        try:
            case.call_and_validate(headers=api.headers, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as exc:  # recorded, then re-raised
            tally.failures.append(
                f"{operation.label} query={case.query} body={str(case.body)[:300]}: "
                f"{type(exc).__name__}: {str(exc)[:400]}"
            )
            raise

    try:
        exercise()
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - a failed case or failed generation
        if not any(f.startswith(operation.label + " ") for f in tally.failures):  # generation failed
            tally.failures.append(f"{operation.label}: {type(exc).__name__}: {str(exc)[:400]}")


@pytest.mark.timeout(600)
def test_extreme_numbers_and_crafted_cursors_never_answer_5xx(api: FuzzApi) -> None:
    """Generated cases and valid bodies, each with one number set to an extreme and any cursor
    crafted: every answer is a schema-conformant non-5xx."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    tally = _Tally()
    for result in schema.get_all_operations():
        operation = result.ok()
        ids = {name: value for name, value in api.path_ids.items() if "{" + name + "}" in operation.path}
        strategies = [operation.as_strategy(path_parameters=ids or None)]
        strategies += [
            operation.as_strategy(path_parameters=ids or None, body=json.loads(json.dumps(body)))
            for body in api.bodies.get(operation.label, [])
        ]
        for strategy in strategies:
            _exercise_with_extremes(api, operation, strategy, tally)
    total = sum(tally.executed.values())
    print(f"schemathesis extremes: {total} cases over {len(tally.executed)} operations")
    assert not tally.failures, "\n".join(tally.failures[:10])
    assert len(tally.executed) >= 20 and total >= 300
    assert tally.executed["POST /v1/jobs/estimate"] >= EXTREME_EXAMPLES * len(api.bodies["POST /v1/jobs/estimate"])


@pytest.mark.parametrize("label", ["GET /v1/datasets", "GET /v1/jobs", "GET /v1/datasets/{dataset_id}/ledger"])
def test_the_cursors_that_once_answered_500_are_examples(api: FuzzApi, label: str) -> None:
    """The reported cases, explicitly: ledger ["abc"] / [2**70], datasets ["2020-01-01", {"x": 1}]."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    operation = schema.find_operation_by_label(label)
    ids = {name: value for name, value in api.path_ids.items() if "{" + name + "}" in operation.path}
    for payload in (["abc"], [2**70], ["2020-01-01", {"x": 1}]):
        case = operation.Case(path_parameters=ids, query={"cursor": encode_cursor(payload)})
        response = case.call_and_validate(headers=api.headers, checks=CHECKS)
        assert response.status_code == 422 and response.json()["type"].endswith("invalid-cursor"), response.text


def test_the_bodies_that_once_answered_500_are_examples(api: FuzzApi) -> None:
    """The reported cases, explicitly: job δ = 5e-324, a Gaussian evaluation's σ = 1e-300 and
    ht-sparse-linreg's μ = 1e-300 are 4xx problems, on top of the generated extremes."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    operation = schema.find_operation_by_label("POST /v1/jobs/estimate")
    bodies = api.bodies["POST /v1/jobs/estimate"]
    dp_sgd = json.loads(json.dumps(bodies[-2]))  # the Gaussian-evaluation variant
    dp_sgd["privacy"]["delta"] = 5e-324
    gaussian = json.loads(json.dumps(bodies[-2]))
    gaussian["evaluation"]["noise_multiplier"] = 1e-300
    (sparse,) = [json.loads(json.dumps(b)) for b in bodies if b["algorithm"]["name"] == "ht-sparse-linreg"]
    sparse["algorithm"]["hyperparameters"]["mu"] = 1e-300
    for body, range_named in ((dp_sgd, "[1e-30, 1)"), (gaussian, "[0.001, 100000]"), (sparse, "gamma/1e+06")):
        response = operation.Case(body=body, media_type="application/json").call_and_validate(
            headers=api.headers, checks=CHECKS
        )
        assert 400 <= response.status_code < 500 and range_named in response.json()["detail"], response.text


@pytest.mark.parametrize(
    ("label", "query"),
    [
        (
            "POST /v1/base-models",
            {"name": "b", "architecture": "mlp", "input_shape": "64", "n_outputs": 10, "params": '{"a": []}'},
        ),
        ("POST /v1/datasets", {"name": "d", "format": "csv", "label_column": "label", "public": True}),
    ],
)
def test_the_json_query_values_that_once_answered_500_are_examples(
    api: FuzzApi, label: str, query: dict[str, object]
) -> None:
    """Issue 36: params nested 5,000 deep or holding a 5,000-digit integer answered 500; each
    hostile document is a 422 problem naming what is wrong with it."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    operation = schema.find_operation_by_label(label)
    name = "params" if "base-models" in label else "preparation"
    for document in HOSTILE_JSON:
        case = operation.Case(query={**query, name: document})
        response = case.call_and_validate(headers=api.headers, checks=CHECKS)
        assert response.status_code == 422, (document[:40], response.text)


def test_an_events_cursor_past_64_bits_is_an_empty_page(api: FuzzApi) -> None:
    """Found by the extremes pass: ``after=2**70`` overflowed SQLite's integer and answered 500."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", api.app)
    operation = schema.find_operation_by_label("GET /v1/jobs/{job_id}/events")
    for after in (2**63, 2**70):
        case = operation.Case(path_parameters={"job_id": api.path_ids["job_id"]}, query={"after": after})
        response = case.call_and_validate(headers=api.headers, checks=CHECKS)
        assert response.status_code == 200 and response.json() == [], response.text
