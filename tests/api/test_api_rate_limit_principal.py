"""The rate limit follows the API key, whatever carries it: Bearer header or dashboard cookie.

Before, the limiter keyed on the Bearer header only, so the dashboard's session cookie was a way
around it. Now both draw on one bucket per key: the signed cookie names the key's digest next to
its server-side session token, so the limiter needs no database lookup.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.routes.ui_session import COOKIE_NAME, SessionCookie, decode_cookie, encode_cookie, session_secret
from kernel.access.keys import key_digest
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from tests.conftest import RecordingDispatcher, make_settings, new_key

BURST = 5


class World:
    def __init__(self, app: object, database: Database, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.alice = new_key(database, "alice")
        self.bob = new_key(database, "bob")

    def client(self, key: str | None = None) -> TestClient:
        client = TestClient(self.app, follow_redirects=False)
        if key:
            client.headers["Authorization"] = f"Bearer {key}"
        return client

    def cookie(self, key: str) -> str:
        """The session cookie a browser gets by logging in with ``key`` through the form."""
        client = self.client()
        token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/ui/login").text)
        assert token is not None
        response = client.post("/ui/login", data={"csrf_token": token.group(1), "api_key": key})
        assert response.status_code == 303, response.text
        value = client.cookies.get(COOKIE_NAME)
        assert value
        return value


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    # One token a minute after the burst: nothing refills while a test runs.
    settings = make_settings(tmp_path / "data", rate_limit_per_minute=1, rate_limit_burst=BURST)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    app = create_app(settings, dispatcher=RecordingDispatcher())
    with TestClient(app):  # run the lifespan
        yield World(app, database, settings)
    database.dispose()


def _with_cookie(cookie: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE_NAME}={cookie}"}


def _statuses(client: TestClient, path: str, n: int, headers: dict[str, str] | None = None) -> list[int]:
    return [client.get(path, headers=headers or {}).status_code for _ in range(n)]


@pytest.mark.parametrize("path", ["/ui/datasets", "/v1/datasets"])
def test_cookie_requests_get_429_after_the_bearer_budget(world: World, path: str) -> None:
    cookie = world.cookie(world.alice)
    statuses = _statuses(world.client(), path, BURST + 3, _with_cookie(cookie))
    assert 429 not in statuses[:BURST]  # /v1 answers 401 to a cookie, but it is still alice's
    assert statuses[BURST:] == [429] * 3
    bearer = _statuses(world.client(world.bob), path, BURST + 1)
    assert 429 not in bearer[:BURST] and bearer[BURST] == 429  # the same budget


def test_cookie_and_bearer_share_one_bucket_per_key(world: World) -> None:
    cookie = world.cookie(world.alice)
    browser, script = world.client(), world.client(world.alice)
    assert _statuses(browser, "/ui/datasets", 3, _with_cookie(cookie)) == [200] * 3
    assert _statuses(script, "/v1/datasets", BURST - 3) == [200] * (BURST - 3)
    refused = browser.get("/ui/datasets", headers=_with_cookie(cookie))
    assert refused.status_code == 429
    assert refused.json()["type"] == "/problems/rate-limited" and refused.headers["Retry-After"]
    assert script.get("/v1/datasets").status_code == 429
    # Another key, by either carrier, is unaffected.
    assert world.client(world.bob).get("/v1/datasets").status_code == 200
    assert world.client().get("/ui/datasets", headers=_with_cookie(world.cookie(world.bob))).status_code == 200


def test_a_forged_cookie_cannot_spend_another_keys_bucket(world: World) -> None:
    """Only a validly signed cookie names a principal: a forged one is anonymous (and unauthenticated)."""
    real = decode_cookie(world.cookie(world.alice), session_secret(world.settings), max_age_s=60)
    assert isinstance(real, SessionCookie) and real.key_digest == key_digest(world.alice)
    forged = encode_cookie(
        SessionCookie(token=real.token, key_digest=real.key_digest, issued_at=time.time()), b"not-the-secret"
    )
    assert 429 not in _statuses(world.client(), "/ui/datasets", BURST + 2, _with_cookie(forged))
    assert _statuses(world.client(world.alice), "/v1/datasets", BURST) == [200] * BURST
