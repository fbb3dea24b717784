"""A strictly sequential client never meets the pricing cap (issue 36, item 5).

Before, the pricing slot was a request-scoped ``yield`` dependency: FastAPI runs its exit after
the response has been sent, so a client that sent its next submission as soon as it read the
answer found its own previous slot still held about one time in ten and got 429
``too-many-computations`` ("per-key limit 1"). The slot is now released when the route returns,
before the answer goes out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.limits.upload_slots import slots_of as upload_slots_of
from api.main import create_app
from api.routes.planning_slots import planning_slots_of
from kernel.bootstrap import migrate
from kernel.config import Settings
from tests.concurrency_helpers import concurrency_settings, live_server, upload_digits
from tests.conftest import RecordingDispatcher, dp_sgd_spec, make_settings, new_key, upload

SEQUENTIAL = 40
TOO_MANY = "/problems/too-many-computations"


def _cheap_spec(dataset_id: str) -> dict[str, object]:
    """An explicit σ and few steps: dozens of these fit the dataset's budget."""
    spec = dp_sgd_spec(dataset_id, noise_multiplier=20.0)
    spec["training"] = {"steps": 5, "batch_size": 64, "learning_rate": 0.5}
    return spec


def _observing(app: FastAPI, seen: list[int], settings: Settings) -> ASGIApp:
    """The app, with the pricing slots in flight recorded when the last byte of an answer is sent:
    what a client that sends its next request at once would find."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def observed(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                seen.append(planning_slots_of(app, settings).in_flight())
            await send(message)

        await app(scope, receive, observed)

    return wrapped


@pytest.mark.parametrize("route", ["/v1/jobs/estimate", "/v1/jobs"])
def test_the_pricing_slot_is_free_when_the_answer_goes_out(tmp_path: Path, digits_csv: bytes, route: str) -> None:
    settings = make_settings(tmp_path / "data", max_concurrent_plans=2, max_concurrent_plans_per_key=1)
    migrate(settings)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    seen: list[int] = []
    with TestClient(_observing(app, seen, settings)) as client:
        client.headers["Authorization"] = f"Bearer {new_key(app.state.services.db, 'alice')}"
        uploaded = upload(client, digits_csv)
        assert uploaded.status_code == 201, uploaded.text  # type: ignore[attr-defined]
        dataset_id = uploaded.json()["id"]  # type: ignore[attr-defined]
        seen.clear()
        answers = [client.post(route, json=_cheap_spec(dataset_id)) for _ in range(3)]
        refused = client.post(route, json=_cheap_spec("ds_no_such_dataset"))
    assert [a.status_code for a in answers] == [200 if route.endswith("estimate") else 202] * 3
    assert refused.status_code == 404  # an error answer gives its slot back before it goes out too
    assert seen == [0, 0, 0, 0], "a pricing slot was still held when its answer was sent"


Post = Callable[[str, dict[str, Any]], Any]


def test_a_sequential_client_of_a_live_server_never_gets_too_many_computations(tmp_path: Path) -> None:
    """Against uvicorn, as the issue measured it: 40 submissions and 40 estimates, each sent as
    soon as the previous answer was read, all answered 202/200, never 429."""
    settings = concurrency_settings(
        tmp_path,
        max_concurrent_plans=Settings().max_concurrent_plans,
        max_concurrent_plans_per_key=Settings().max_concurrent_plans_per_key,
        max_active_jobs_per_tenant=1000,
    )
    migrate(settings)
    with live_server(settings) as service:
        key = service.tenant_key("alice")
        with service.client(key) as client:
            dataset = upload_digits(client, epsilon=100.0)
            statuses: list[tuple[str, int, str]] = []
            for _ in range(SEQUENTIAL):
                for route in ("/v1/jobs", "/v1/jobs/estimate"):
                    response = client.post(route, json=_cheap_spec(dataset["id"]))
                    kind = response.json().get("type", "") if response.status_code >= 400 else ""
                    statuses.append((route, response.status_code, kind))
    refused = [s for s in statuses if s[1] == 429]
    assert not refused, f"{len(refused)} of {len(statuses)} sequential requests got 429: {refused[:5]}"
    assert {s[1] for s in statuses} == {200, 202}, statuses


def test_the_upload_slot_is_free_when_the_answer_goes_out(tmp_path: Path, digits_csv: bytes) -> None:
    """The same for uploads (one slot per tenant here): a tenant uploading one file after another
    never meets its own previous upload's slot."""
    settings = make_settings(
        tmp_path / "data", max_upload_bytes=5_000_000, max_concurrent_uploads_per_tenant=1, max_concurrent_uploads=1
    )
    migrate(settings)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    seen: list[int] = []

    async def observing(scope: Scope, receive: Receive, send: Send) -> None:
        async def observed(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                seen.append(upload_slots_of(app, total=1, per_tenant=1).in_flight())
            await send(message)

        await app(scope, receive, observed)

    with TestClient(observing) as client:
        client.headers["Authorization"] = f"Bearer {new_key(app.state.services.db, 'alice')}"
        answers = [upload(client, digits_csv, name=f"copy-{i}", epsilon=1 + i) for i in range(3)]
    assert [a.status_code for a in answers] == [201, 409, 409]  # the same rows: refused, but never 429
    assert seen == [0, 0, 0], "an upload slot was still held when its answer was sent"
