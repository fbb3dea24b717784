"""Dashboard authentication: login form with CSRF, the signed HttpOnly SameSite=Strict cookie
scoped to /ui, logout, forged/expired/revoked sessions, and the unchanged Bearer-only /v1 API."""

from __future__ import annotations

import datetime as dt
import time

from sqlalchemy import update

from app.api.ui_session import COOKIE_NAME, decode_session, encode_session, new_session, session_secret
from app.auth import key_digest
from app.models import ApiKey
from tests.conftest import new_key
from tests.ui.conftest import UiWorld, csrf_token_of


def test_pages_redirect_to_login_without_a_session(ui_world: UiWorld) -> None:
    client = ui_world.client()
    for path in ("/ui", "/ui/datasets", f"/ui/datasets/{ui_world.dataset_id}", "/ui/jobs",
                 f"/ui/jobs/{ui_world.job_id}", f"/ui/jobs/{ui_world.job_id}/report"):
        response = client.get(path)
        assert response.status_code == 303 and response.headers["location"] == "/ui/login", path
    assert client.get(f"/ui/jobs/{ui_world.job_id}/events").status_code == 401


def test_login_sets_a_strict_httponly_cookie_for_ui_only(ui_world: UiWorld) -> None:
    client = ui_world.client()
    form = client.get("/ui/login")
    anonymous_cookie = form.headers["set-cookie"].lower()
    for attribute in ("httponly", "samesite=strict", "path=/ui"):
        assert attribute in anonymous_cookie
    response = client.post("/ui/login", data={"csrf_token": csrf_token_of(form.text), "api_key": ui_world.alice_key})
    assert response.status_code == 303 and response.headers["location"] == "/ui/datasets"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    value = client.cookies[COOKIE_NAME]
    assert ui_world.alice_key not in value
    session = decode_session(value, session_secret(ui_world.settings), max_age_s=60)
    assert session is not None and session.key_digest == key_digest(ui_world.alice_key)
    assert session.csrf_token != csrf_token_of(form.text), "a fresh CSRF token after login"
    assert client.get("/ui/datasets").status_code == 200


def test_login_rejects_a_bad_key_and_missing_or_wrong_csrf(ui_world: UiWorld) -> None:
    client = ui_world.client()
    token = csrf_token_of(client.get("/ui/login").text)
    bad_key = client.post("/ui/login", data={"csrf_token": token, "api_key": "pt_not-a-key"})
    assert bad_key.status_code == 401 and "unknown or revoked" in bad_key.text
    assert COOKIE_NAME not in bad_key.headers.get("set-cookie", "")
    for data in ({"api_key": ui_world.alice_key}, {"csrf_token": "forged", "api_key": ui_world.alice_key}):
        refused = client.post("/ui/login", data=data)
        assert refused.status_code == 403
    cross_site = client.post("/ui/login", data={"csrf_token": token, "api_key": ui_world.alice_key},
                             headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403
    no_cookie = ui_world.client().post("/ui/login", data={"csrf_token": token, "api_key": ui_world.alice_key})
    assert no_cookie.status_code == 403, "the token must match this browser's session"
    assert client.get("/ui/datasets").status_code == 303


def test_logout_needs_the_csrf_token_and_ends_the_session(ui_world: UiWorld) -> None:
    client = ui_world.logged_in(ui_world.alice_key)
    page = client.get("/ui/datasets")
    token = csrf_token_of(page.text)
    assert client.post("/ui/logout", data={}).status_code == 403
    assert client.post("/ui/logout", data={"csrf_token": "x" + token}).status_code == 403
    assert client.post("/ui/logout", data={"csrf_token": token},
                       headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.get("/ui/datasets").status_code == 200, "refused logouts change nothing"
    response = client.post("/ui/logout", data={"csrf_token": token})
    assert response.status_code == 303 and response.headers["location"] == "/ui/login"
    assert "Max-Age=0" in response.headers["set-cookie"] or 'expires=' in response.headers["set-cookie"].lower()
    assert client.get("/ui/datasets").status_code == 303


def test_forged_expired_and_revoked_sessions_are_refused(ui_world: UiWorld) -> None:
    secret = session_secret(ui_world.settings)
    digest_session = new_session(key_digest(ui_world.alice_key))
    good = encode_session(digest_session, secret)
    payload, signature = good.split(".")
    forged_other = encode_session(new_session(key_digest(ui_world.alice_key)), b"another secret")
    for value in (payload + "." + signature[:-2] + "AA", forged_other, "garbage", payload):
        client = ui_world.client()
        client.cookies.set(COOKIE_NAME, value, path="/ui")
        assert client.get("/ui/datasets").status_code == 303, value
    assert decode_session(good, secret, max_age_s=60, now=time.time() + 61) is None
    assert decode_session(good, secret, max_age_s=60) is not None
    key = new_key(ui_world.db, "carol")
    client = ui_world.logged_in(key)
    assert client.get("/ui/datasets").status_code == 200
    with ui_world.db.write_transaction() as tx:
        tx.execute(update(ApiKey).where(ApiKey.digest == key_digest(key)).values(revoked_at=dt.datetime.now(dt.UTC)))
    assert client.get("/ui/datasets").status_code == 303, "revoking the key ends its sessions"


def test_bearer_works_on_ui_and_the_cookie_never_authenticates_v1(ui_world: UiWorld) -> None:
    assert ui_world.client(ui_world.alice_key).get("/ui/datasets").status_code == 200
    assert ui_world.client("pt_wrong").get("/ui/datasets").status_code == 303
    browser = ui_world.logged_in(ui_world.alice_key)
    value = browser.cookies[COOKIE_NAME]
    api = ui_world.client()
    response = api.get("/v1/datasets", headers={"Cookie": f"{COOKIE_NAME}={value}"})
    assert response.status_code == 401


def test_oversized_or_odd_form_bodies_are_refused_not_crashing(ui_world: UiWorld) -> None:
    client = ui_world.client()
    token = csrf_token_of(client.get("/ui/login").text)
    form = "application/x-www-form-urlencoded"
    big = f"csrf_token={token}&api_key={ui_world.alice_key}&pad=" + "x" * 10_000
    many = f"csrf_token={token}&" + "&".join(f"f{i}=1" for i in range(50))
    for body, content_type in ((big, form), (many, form), (f"csrf_token={token}", "application/json")):
        response = client.post("/ui/login", content=body, headers={"Content-Type": content_type})
        assert response.status_code == 403, body[:40]
