"""The dashboard's cookie: signed, HttpOnly, SameSite=Strict, scoped to ``/ui``.

Why a cookie at all: browsers' EventSource cannot send an Authorization header, and a person
should paste the API key once, not on every page. Design:

- After login the cookie carries the session's random 256-bit token; the session itself lives in
  the database (:mod:`kernel.access.dashboard_sessions`), which stores only the token's SHA-256 digest.
  Every request looks the session up again, so logout, expiry and revoking the key end it at
  once, for every copy of the cookie. The cookie also names the key's digest (never the key):
  the rate limiter reads it to put cookie and Bearer requests of one key on one bucket without a
  database lookup; it authenticates nothing.
- Before login the cookie carries only the login form's CSRF token. It grants nothing, so it
  stays stateless (no row for every visitor of the login page).
- Both kinds are HMAC-SHA256-signed with ``PRIVTRAIN_UI_SESSION_SECRET`` (defence in depth: a
  forged cookie is refused before any lookup) and carry their issue time, bounded by
  ``ui_session_max_age_s``.
- ``Path=/ui``: the cookie never reaches ``/v1``, whose Bearer-only authentication (and so its
  freedom from CSRF) is unchanged.
- Form posts carry the session's CSRF token (synchroniser token; the login form too, against
  login CSRF); a cross-origin ``Origin`` or ``Sec-Fetch-Site`` is refused, and SameSite=Strict is
  another wall. Dashboard pages send ``Referrer-Policy: same-origin`` so that browsers put the
  real ``Origin`` on their own form posts (under ``no-referrer`` Chromium sends ``Origin: null``).
- stdlib ``hmac`` instead of itsdangerous/SessionMiddleware: no new dependency, and the cookie
  is scoped to the dashboard instead of every request of the app.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response

from kernel.config import Settings

__all__ = [
    "COOKIE_NAME",
    "COOKIE_PATH",
    "SAME_ORIGIN_FETCH_SITES",
    "LoginFormCookie",
    "SessionCookie",
    "UiCookie",
    "clear_session_cookie",
    "csrf_ok",
    "decode_cookie",
    "encode_cookie",
    "new_login_form",
    "read_cookie",
    "session_secret",
    "set_session_cookie",
]

COOKIE_NAME = "privtrain_ui"
COOKIE_PATH = "/ui"
_SIGNING_CONTEXT = b"privtrain-ui-cookie-v2:"
CLOCK_SKEW_S = 60


@dataclass(frozen=True)
class LoginFormCookie:
    """Before login: the login form's CSRF token."""

    csrf_token: str
    issued_at: float

    def fields(self) -> dict[str, Any]:
        return {"v": "form", "c": self.csrf_token, "t": self.issued_at}


@dataclass(frozen=True)
class SessionCookie:
    """After login: the server-side session's token, and the key digest the rate limiter reads."""

    token: str
    key_digest: str
    issued_at: float

    def fields(self) -> dict[str, Any]:
        return {"v": "session", "s": self.token, "k": self.key_digest, "t": self.issued_at}


UiCookie = LoginFormCookie | SessionCookie

_PARSERS: Mapping[str, Callable[[dict[str, Any]], UiCookie]] = {
    "form": lambda data: LoginFormCookie(csrf_token=str(data["c"]), issued_at=float(data["t"])),
    "session": lambda data: SessionCookie(token=str(data["s"]), key_digest=str(data["k"]), issued_at=float(data["t"])),
}
"""How each kind of cookie is read back, by its ``v`` field."""


def session_secret(settings: Settings) -> bytes:
    """The configured secret, or (outside production) a random one kept in the data dir so that
    sessions survive restarts and are shared by every process of one deployment."""
    if settings.ui_session_secret is not None:
        return settings.ui_session_secret.get_secret_value().encode()
    path = Path(settings.data_dir) / "ui-session.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process won the race
        else:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_urlsafe(48))
    return path.read_text().strip().encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: bytes, payload: str) -> str:
    return _b64(hmac.new(secret, _SIGNING_CONTEXT + payload.encode(), hashlib.sha256).digest())


def encode_cookie(cookie: UiCookie, secret: bytes) -> str:
    payload = _b64(json.dumps(cookie.fields(), separators=(",", ":")).encode())
    return f"{payload}.{_signature(secret, payload)}"


def decode_cookie(value: str | None, secret: bytes, *, max_age_s: float, now: float | None = None) -> UiCookie | None:
    """The cookie's content, or None if absent, forged, malformed or too old. A session cookie
    that decodes is not yet a live session: the caller looks its token up."""
    if not value or value.count(".") != 1:
        return None
    payload, signature = value.split(".")
    if not hmac.compare_digest(signature, _signature(secret, payload)):
        return None
    try:
        data = json.loads(_unb64(payload))
        cookie = _PARSERS[data["v"]](data)
    except (ValueError, KeyError, TypeError):
        return None
    current = time.time() if now is None else now
    if not (cookie.issued_at <= current + CLOCK_SKEW_S and current - cookie.issued_at < max_age_s):
        return None
    return cookie


def new_login_form() -> LoginFormCookie:
    return LoginFormCookie(csrf_token=secrets.token_urlsafe(32), issued_at=time.time())


def read_cookie(request: Request, settings: Settings) -> UiCookie | None:
    return decode_cookie(
        request.cookies.get(COOKIE_NAME), session_secret(settings), max_age_s=settings.ui_session_max_age_s
    )


def set_session_cookie(response: Response, cookie: UiCookie, settings: Settings) -> None:
    response.set_cookie(
        COOKIE_NAME,
        encode_cookie(cookie, session_secret(settings)),
        max_age=int(settings.ui_session_max_age_s),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=settings.environment == "production",
    )


def clear_session_cookie(response: Response, settings: Settings) -> None:
    response.delete_cookie(
        COOKIE_NAME,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=settings.environment == "production",
    )


SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})
"""``Sec-Fetch-Site`` values of a request this site (or the user, by hand) started; browsers set
the header themselves and page scripts cannot change it."""


def _same_origin(request: Request) -> bool:
    """The browser does not say the request comes from another site.

    ``Sec-Fetch-Site`` (every current browser) is checked first: ``cross-site`` and ``same-site``
    (a sibling subdomain) are refused. A real ``Origin`` must name this host. ``Origin: null``
    means the browser withheld the origin — a ``no-referrer`` page's form, a sandboxed frame, a
    ``data:`` or ``file:`` page, a redirect across origins — so it proves nothing either way: it
    passes only when ``Sec-Fetch-Site`` vouches for the same origin. No header at all (scripts,
    old browsers) passes: the CSRF token is the real protection, this is a second wall.
    """
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in SAME_ORIGIN_FETCH_SITES:
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    if origin == "null":
        return fetch_site == "same-origin"
    return urlsplit(origin).netloc == request.headers.get("host", "")


def csrf_ok(request: Request, expected: str | None, submitted: str | None) -> bool:
    """The submitted token equals the expected one (the session's, or the login form's), and the
    browser does not say the request is cross-origin."""
    if not expected or not submitted or not _same_origin(request):
        return False
    return hmac.compare_digest(submitted, expected)
