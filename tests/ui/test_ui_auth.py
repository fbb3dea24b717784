"""Dashboard authentication: login form with CSRF, the signed HttpOnly SameSite=Strict cookie
scoped to /ui, server-side sessions (logout and key revocation end every copy of a cookie; expired,
forged and unknown sessions are refused; the table holds no usable token), and the unchanged
Bearer-only /v1 API."""

from __future__ import annotations

import datetime as dt
import secrets
import time

from sqlalchemy import func, select, update

from api.routes.ui_session import (
    COOKIE_NAME,
    LoginFormCookie,
    SessionCookie,
    decode_cookie,
    encode_cookie,
    session_secret,
)
from kernel.access.dashboard_sessions import token_digest
from kernel.access.keys import find_api_keys, key_digest, revoke_api_key
from kernel.db.orm import ApiKey, UiSession, utcnow
from tests.conftest import new_key
from tests.ui.conftest import UiWorld, csrf_token_of


def _cookie_of(ui_world: UiWorld, value: str) -> SessionCookie:
    cookie = decode_cookie(value, session_secret(ui_world.settings), max_age_s=60)
    assert isinstance(cookie, SessionCookie)
    return cookie


def _row_of(ui_world: UiWorld, token: str) -> UiSession:
    with ui_world.db.read_session() as session:
        row = session.scalar(select(UiSession).where(UiSession.token_digest == token_digest(token)))
    assert row is not None
    return row


def _replay(ui_world: UiWorld, value: str, path: str = "/ui/datasets") -> int:
    """A request from another browser (its own cookie jar) carrying a copied cookie value."""
    client = ui_world.client()
    client.cookies.set(COOKIE_NAME, value, path="/ui")
    return client.get(path).status_code


def test_pages_redirect_to_login_without_a_session(ui_world: UiWorld) -> None:
    client = ui_world.client()
    for path in (
        "/ui",
        "/ui/datasets",
        f"/ui/datasets/{ui_world.dataset_id}",
        "/ui/jobs",
        f"/ui/jobs/{ui_world.job_id}",
        f"/ui/jobs/{ui_world.job_id}/report",
    ):
        response = client.get(path)
        assert response.status_code == 303 and response.headers["location"] == "/ui/login", path
    assert client.get(f"/ui/jobs/{ui_world.job_id}/events").status_code == 401


def test_login_starts_a_server_side_session_behind_a_strict_httponly_cookie(ui_world: UiWorld) -> None:
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
    session_cookie = _cookie_of(ui_world, value)
    assert session_cookie.key_digest == key_digest(ui_world.alice_key)
    row = _row_of(ui_world, session_cookie.token)  # the row is found by the token's digest
    assert row.ended_at is None and row.csrf_token != csrf_token_of(form.text), "a fresh CSRF token after login"
    page = client.get("/ui/datasets")
    assert page.status_code == 200 and csrf_token_of(page.text) == row.csrf_token
    assert client.get("/ui/login").headers["location"] == "/ui/datasets", "no orphaned session"


def test_login_rejects_a_bad_key_and_missing_or_wrong_csrf(ui_world: UiWorld) -> None:
    with ui_world.db.read_session() as session:
        before = session.scalar(select(func.count()).select_from(UiSession))
    client = ui_world.client()
    token = csrf_token_of(client.get("/ui/login").text)
    bad_key = client.post("/ui/login", data={"csrf_token": token, "api_key": "pt_not-a-key"})
    assert bad_key.status_code == 401 and "unknown or revoked" in bad_key.text
    assert COOKIE_NAME not in bad_key.headers.get("set-cookie", "")
    for data in ({"api_key": ui_world.alice_key}, {"csrf_token": "forged", "api_key": ui_world.alice_key}):
        refused = client.post("/ui/login", data=data)
        assert refused.status_code == 403
    cross_site = client.post(
        "/ui/login",
        data={"csrf_token": token, "api_key": ui_world.alice_key},
        headers={"Origin": "https://evil.example"},
    )
    assert cross_site.status_code == 403
    no_cookie = ui_world.client().post("/ui/login", data={"csrf_token": token, "api_key": ui_world.alice_key})
    assert no_cookie.status_code == 403, "the token must match this browser's login form"
    assert client.get("/ui/datasets").status_code == 303
    with ui_world.db.read_session() as session:
        assert session.scalar(select(func.count()).select_from(UiSession)) == before, "refused logins store nothing"


def test_logout_needs_the_csrf_token_and_ends_the_session(ui_world: UiWorld) -> None:
    client = ui_world.logged_in(ui_world.alice_key)
    page = client.get("/ui/datasets")
    token = csrf_token_of(page.text)
    other = csrf_token_of(ui_world.logged_in(ui_world.alice_key).get("/ui/datasets").text)
    assert client.post("/ui/logout", data={}).status_code == 403
    assert client.post("/ui/logout", data={"csrf_token": "x" + token}).status_code == 403
    assert client.post("/ui/logout", data={"csrf_token": other}).status_code == 403, "another session's token"
    assert (
        client.post("/ui/logout", data={"csrf_token": token}, headers={"Origin": "http://evil.example"}).status_code
        == 403
    )
    assert client.get("/ui/datasets").status_code == 200, "refused logouts change nothing"
    response = client.post("/ui/logout", data={"csrf_token": token})
    assert response.status_code == 303 and response.headers["location"] == "/ui/login"
    assert "Max-Age=0" in response.headers["set-cookie"] or "expires=" in response.headers["set-cookie"].lower()
    assert client.get("/ui/datasets").status_code == 303


def test_a_cookie_captured_before_logout_is_refused_after_it(ui_world: UiWorld) -> None:
    """The finding: logout only dropped the browser's copy; a copied cookie kept working."""
    client = ui_world.logged_in(ui_world.alice_key)
    captured = client.cookies[COOKIE_NAME]
    assert _replay(ui_world, captured) == 200
    token = csrf_token_of(client.get("/ui/datasets").text)
    assert client.post("/ui/logout", data={"csrf_token": token}).status_code == 303
    for path in ("/ui/datasets", "/ui/jobs", f"/ui/jobs/{ui_world.job_id}"):
        assert _replay(ui_world, captured, path) == 303, path
    assert _replay(ui_world, captured, f"/ui/jobs/{ui_world.job_id}/events") == 401
    assert _row_of(ui_world, _cookie_of(ui_world, captured).token).ended_at is not None
    replayed = ui_world.client()
    replayed.cookies.set(COOKIE_NAME, captured, path="/ui")
    again = replayed.post("/ui/logout", data={"csrf_token": token})
    assert again.status_code == 403, "an ended session's CSRF token is worth nothing either"


def test_revoking_the_key_ends_its_sessions(ui_world: UiWorld) -> None:
    key = new_key(ui_world.db, "carol")
    first, second = ui_world.logged_in(key), ui_world.logged_in(key)
    assert first.get("/ui/datasets").status_code == 200 and second.get("/ui/datasets").status_code == 200
    with ui_world.db.write_transaction() as tx:
        (api_key,) = find_api_keys(tx, key)
        assert revoke_api_key(tx, api_key)
    assert first.get("/ui/datasets").status_code == 303 and second.get("/ui/datasets").status_code == 303
    for client in (first, second):
        assert _row_of(ui_world, _cookie_of(ui_world, client.cookies[COOKIE_NAME]).token).ended_at is not None


def test_a_revoked_key_is_refused_even_where_revocation_did_not_end_the_rows(ui_world: UiWorld) -> None:
    """A key revoked by a plain UPDATE (an older admin tool, a restore): the lookup checks the key too."""
    key = new_key(ui_world.db, "dave")
    client = ui_world.logged_in(key)
    assert client.get("/ui/datasets").status_code == 200
    with ui_world.db.write_transaction() as tx:
        tx.execute(update(ApiKey).where(ApiKey.digest == key_digest(key)).values(revoked_at=utcnow()))
    assert client.get("/ui/datasets").status_code == 303


def test_an_expired_session_is_refused(ui_world: UiWorld) -> None:
    client = ui_world.logged_in(ui_world.alice_key)
    token = _cookie_of(ui_world, client.cookies[COOKIE_NAME]).token
    with ui_world.db.write_transaction() as tx:
        tx.execute(
            update(UiSession)
            .where(UiSession.token_digest == token_digest(token))
            .values(expires_at=utcnow() - dt.timedelta(seconds=1))
        )
    assert client.get("/ui/datasets").status_code == 303
    assert client.get(f"/ui/jobs/{ui_world.job_id}/events").status_code == 401


def test_forged_and_unknown_sessions_are_refused(ui_world: UiWorld) -> None:
    secret = session_secret(ui_world.settings)
    real = _cookie_of(ui_world, ui_world.logged_in(ui_world.alice_key).cookies[COOKIE_NAME])
    good = encode_cookie(real, secret)
    assert _replay(ui_world, good) == 200
    payload, signature = good.split(".")
    refused = {
        "tampered signature": payload + "." + signature[:-2] + "AA",
        "another secret": encode_cookie(real, b"another secret of thirty-two chars"),
        "garbage": "garbage",
        "unsigned": payload,
        "unknown token, validly signed": encode_cookie(
            SessionCookie(token=secrets.token_urlsafe(32), key_digest=real.key_digest, issued_at=time.time()), secret
        ),
        "real token, other key's digest": encode_cookie(
            SessionCookie(token=real.token, key_digest=key_digest(ui_world.bob_key), issued_at=time.time()), secret
        ),
        "login form cookie": encode_cookie(LoginFormCookie(csrf_token="x", issued_at=time.time()), secret),
    }
    for name, value in refused.items():
        assert _replay(ui_world, value) == 303, name


def test_a_database_dump_holds_no_usable_token(ui_world: UiWorld) -> None:
    client = ui_world.logged_in(ui_world.alice_key)
    real = _cookie_of(ui_world, client.cookies[COOKIE_NAME])
    row = _row_of(ui_world, real.token)
    dumped = " ".join(str(value) for value in (row.id, row.token_digest, row.api_key_id, row.csrf_token))
    assert real.token not in dumped and ui_world.alice_key not in dumped
    secret = session_secret(ui_world.settings)
    for stolen in (row.token_digest, row.id, row.csrf_token):  # even with the signing secret
        forged = encode_cookie(SessionCookie(token=stolen, key_digest=real.key_digest, issued_at=time.time()), secret)
        assert _replay(ui_world, forged) == 303, stolen


def test_login_purges_sessions_over_a_day_past_their_end(ui_world: UiWorld) -> None:
    with ui_world.db.read_session() as session:
        api_key_id = session.scalar(select(ApiKey.id).where(ApiKey.digest == key_digest(ui_world.alice_key)))
    now = utcnow()
    rows = {
        "ended two days ago": UiSession(
            token_digest=secrets.token_hex(32),
            api_key_id=api_key_id,
            csrf_token="c",
            expires_at=now + dt.timedelta(hours=1),
            ended_at=now - dt.timedelta(days=2),
        ),
        "expired two days ago": UiSession(
            token_digest=secrets.token_hex(32),
            api_key_id=api_key_id,
            csrf_token="c",
            expires_at=now - dt.timedelta(days=2),
        ),
        "ended an hour ago": UiSession(
            token_digest=secrets.token_hex(32),
            api_key_id=api_key_id,
            csrf_token="c",
            expires_at=now + dt.timedelta(hours=1),
            ended_at=now - dt.timedelta(hours=1),
        ),
    }
    with ui_world.db.write_transaction() as tx:
        tx.add_all(rows.values())
    ids = {name: row.id for name, row in rows.items()}
    ui_world.logged_in(ui_world.alice_key)
    with ui_world.db.read_session() as session:
        left = set(session.scalars(select(UiSession.id).where(UiSession.id.in_(ids.values()))))
    assert left == {ids["ended an hour ago"]}


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
