"""Crafted pagination cursors: every malformed one is a 422 ``invalid-cursor``, never a 5xx.

Cursors are encoded exactly as the API encodes them (``encode_cursor``), so the values reach the
decoder's type and range checks instead of failing at base64 or JSON.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.db.pagination import encode_cursor
from tests.conftest import dp_sgd_spec, upload

INVALID_CURSOR = "/problems/invalid-cursor"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
"""Any JSON value: what a client can put in a cursor it crafts."""

cursor_payloads = st.one_of(
    json_values,
    st.lists(json_values, min_size=1, max_size=3),  # right or near arity, wrong types
    st.tuples(st.text(max_size=40), json_values).map(list),
    st.integers().map(lambda n: [n]),
    st.sampled_from(
        [
            ["abc"],
            [2**70],
            [-1],
            [True],
            [1.5],
            ["2020-01-01", {"x": 1}],
            ["0001-01-01T00:00:00+14:00", "ds_x"],
            ["9999-12-31T23:59:59-14:00", "ds_x"],
            ["2020-01-01", "ds_\u0000"],
            ["2020-01-01", "\ud800"],
            ["\ud800"],
        ]
    ),
)


@pytest.fixture
def routes(alice: TestClient, dataset_id: str) -> list[str]:
    """Every paginated route (``grep -rn decode_cursor app``)."""
    return [
        "/v1/datasets",
        f"/v1/datasets/{dataset_id}/ledger",
        "/v1/jobs",
        "/v1/invitations",
        f"/v1/datasets/{dataset_id}/grants",
    ]


def _get(client: TestClient, route: str, cursor: str) -> Any:
    return client.get(route, params={"cursor": cursor, "limit": 1})


def _assert_invalid_cursor(response: Any) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"] == INVALID_CURSOR


@pytest.mark.parametrize(
    ("route_index", "payload"),
    [
        (1, ["abc"]),
        (1, [2**70]),
        (1, [True]),
        (1, [-1]),
        (0, ["2020-01-01", {"x": 1}]),
        (0, ["2020-01-01", "ds_\u0000"]),
        (0, ["0001-01-01T00:00:00+14:00", "ds_x"]),
        (0, [1, 2]),
        (2, [{"x": 1}]),
        (2, ["job_\u0000"]),
        (2, []),
    ],
)
def test_reported_cursors_are_invalid_cursor_problems(
    alice: TestClient, routes: list[str], route_index: int, payload: list[Any]
) -> None:
    _assert_invalid_cursor(_get(alice, routes[route_index], encode_cursor(payload)))


@pytest.mark.parametrize(
    "cursor",
    [
        "!!",
        "é",
        "A" * 5000,
        base64.urlsafe_b64encode(b"[" * 900).decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_undecodable_cursors_are_invalid_cursor_problems(alice: TestClient, routes: list[str], cursor: str) -> None:
    for route in routes:
        _assert_invalid_cursor(_get(alice, route, cursor))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=cursor_payloads)
def test_any_json_cursor_never_answers_5xx(alice: TestClient, routes: list[str], payload: Any) -> None:
    cursor = encode_cursor(payload) if not isinstance(payload, str) or payload else "W10"
    for route in routes:
        response = _get(alice, route, cursor)
        assert response.status_code < 500, (route, payload, response.text)
        if response.status_code != 200:
            _assert_invalid_cursor(response)


def _page_through(client: TestClient, route: str) -> int:
    seen, cursor = 0, None
    while True:
        response = client.get(route, params={"limit": 1} | ({"cursor": cursor} if cursor else {}))
        assert response.status_code == 200, response.text
        seen += len(response.json()["items"])
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return seen


def test_cursors_the_api_hands_out_still_page(alice: TestClient, digits_csv: bytes, dataset_id: str) -> None:
    """The checks accept our own cursors: every paginated route pages to its end."""
    assert upload(alice, digits_csv + digits_csv.splitlines(keepends=True)[1], name="more").status_code == 201
    for epsilon in (9, 10):
        assert alice.post(f"/v1/datasets/{dataset_id}/budget", json={"epsilon": epsilon}).status_code == 200
    for _ in range(2):
        assert alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).status_code == 202
    assert _page_through(alice, "/v1/datasets") == 2
    assert _page_through(alice, f"/v1/datasets/{dataset_id}/ledger") >= 2
    assert _page_through(alice, "/v1/jobs") == 2
