"""Dashboard sessions: a signed, HttpOnly, SameSite=Strict cookie scoped to ``/ui``.

Why a cookie at all: browsers' EventSource cannot send an Authorization header, and a person
should paste the API key once, not on every page. Design:

- The cookie holds the SHA-256 digest of the API key (the same digest the database stores),
  never the key itself, plus a CSRF token and the issue time, HMAC-SHA256-signed with
  ``PRIVTRAIN_UI_SESSION_SECRET``. Every request looks the digest up again, so revoking the key
  ends its dashboard sessions at once; ``ui_session_max_age_s`` bounds a stolen cookie's life.
- ``Path=/ui``: the cookie never reaches ``/v1``, whose Bearer-only authentication (and so its
  freedom from CSRF) is unchanged.
- Form posts carry the session's CSRF token (synchroniser token; the login form too, against
  login CSRF) and a cross-origin ``Origin`` header is refused; SameSite=Strict is a second wall.
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
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fastapi import Request, Response

from app.config import Settings

COOKIE_NAME = "privtrain_ui"
COOKIE_PATH = "/ui"
_SIGNING_CONTEXT = b"privtrain-ui-session-v1:"


@dataclass(frozen=True)
class UiSession:
    """A verified session: ``key_digest`` is None before login (the login form's CSRF token)."""

    key_digest: str | None
    csrf_token: str
    issued_at: float


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


def encode_session(session: UiSession, secret: bytes) -> str:
    payload = _b64(json.dumps(
        {"k": session.key_digest, "c": session.csrf_token, "t": session.issued_at}, separators=(",", ":")
    ).encode())
    return f"{payload}.{_signature(secret, payload)}"


def decode_session(value: str | None, secret: bytes, *, max_age_s: float, now: float | None = None) -> UiSession | None:
    """The session in a cookie value, or None if absent, forged, malformed or expired."""
    if not value or value.count(".") != 1:
        return None
    payload, signature = value.split(".")
    if not hmac.compare_digest(signature, _signature(secret, payload)):
        return None
    try:
        data = json.loads(_unb64(payload))
        session = UiSession(key_digest=data["k"], csrf_token=str(data["c"]), issued_at=float(data["t"]))
    except (ValueError, KeyError, TypeError):
        return None
    current = time.time() if now is None else now
    if not (session.issued_at <= current + 60 and current - session.issued_at < max_age_s):
        return None
    return session


def new_session(key_digest: str | None) -> UiSession:
    return UiSession(key_digest=key_digest, csrf_token=secrets.token_urlsafe(32), issued_at=time.time())


def read_session(request: Request, settings: Settings) -> UiSession | None:
    return decode_session(
        request.cookies.get(COOKIE_NAME), session_secret(settings), max_age_s=settings.ui_session_max_age_s
    )


def set_session_cookie(response: Response, session: UiSession, settings: Settings) -> None:
    response.set_cookie(
        COOKIE_NAME,
        encode_session(session, session_secret(settings)),
        max_age=int(settings.ui_session_max_age_s),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=settings.environment == "production",
    )


def clear_session_cookie(response: Response, settings: Settings) -> None:
    response.delete_cookie(
        COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="strict",
        secure=settings.environment == "production",
    )


def csrf_ok(request: Request, session: UiSession | None, submitted: str | None) -> bool:
    """The submitted token equals the session's, and the request is not cross-origin."""
    if session is None or not submitted:
        return False
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        return False  # also refuses "null" (sandboxed or privacy-sensitive contexts)
    return hmac.compare_digest(submitted, session.csrf_token)
