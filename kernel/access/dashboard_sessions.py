"""Dashboard sessions kept server-side (table ``ui_sessions``): login starts one, logout and key
revocation end it.

Why server-side: a session that lives only in a signed cookie cannot be ended; a cookie captured
before logout kept working until it expired. Now every dashboard request looks its row up, and a
session is live only while ``ended_at`` is NULL, ``expires_at`` is in the future and its API key
is not revoked.

The cookie carries a random 256-bit token; the table holds only its SHA-256 digest (a database
dump replays no session). Rows ended or expired more than ``PURGE_AFTER`` ago are deleted at each
login, so the table stays bounded by the logins of the last day and the live sessions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import ColumnElement, delete, or_, select, update
from sqlalchemy.orm import Session

from kernel.db.changed_rows import changed_rows
from kernel.db.orm import ApiKey, UiSession, utcnow

__all__ = [
    "DashboardSession",
    "StartedSession",
    "end_session",
    "end_sessions_of_key",
    "live_session",
    "live_session_by_id",
    "purge_old_sessions",
    "start_session",
    "token_digest",
]

TOKEN_BYTES = 32
PURGE_AFTER = dt.timedelta(days=1)


@dataclass(frozen=True)
class DashboardSession:
    """A live session as the dashboard needs it; never holds the token."""

    id: str
    api_key_id: str
    key_digest: str
    tenant_id: str
    csrf_token: str


@dataclass(frozen=True)
class StartedSession:
    """A new session and its token: the token goes into the cookie and nowhere else."""

    token: str
    session: DashboardSession


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def start_session(
    session: Session, *, api_key: ApiKey, max_age_s: float, now: dt.datetime | None = None
) -> StartedSession:
    """Store a new session for an active key (the caller checked it) and purge old rows."""
    current = now or utcnow()
    purge_old_sessions(session, now=current)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    row = UiSession(
        token_digest=token_digest(token),
        api_key_id=api_key.id,
        csrf_token=secrets.token_urlsafe(32),
        created_at=current,
        expires_at=current + dt.timedelta(seconds=max_age_s),
    )
    session.add(row)
    session.flush()
    return StartedSession(
        token=token,
        session=DashboardSession(
            id=row.id,
            api_key_id=api_key.id,
            key_digest=api_key.digest,
            tenant_id=api_key.tenant_id,
            csrf_token=row.csrf_token,
        ),
    )


def live_session(session: Session, token: str, *, now: dt.datetime | None = None) -> DashboardSession | None:
    """The session a cookie token names, if it is live: not ended, not expired, key not revoked."""
    return _live(session, UiSession.token_digest == token_digest(token), now=now)


def live_session_by_id(session: Session, session_id: str, *, now: dt.datetime | None = None) -> DashboardSession | None:
    """The same check by id: what an open event stream re-checks at every poll."""
    return _live(session, UiSession.id == session_id, now=now)


def _live(session: Session, which: ColumnElement[bool], *, now: dt.datetime | None) -> DashboardSession | None:
    found = session.execute(
        select(UiSession, ApiKey)
        .join(ApiKey, ApiKey.id == UiSession.api_key_id)
        .where(
            which,
            UiSession.ended_at.is_(None),
            UiSession.expires_at > (now or utcnow()),
            ApiKey.revoked_at.is_(None),
        )
    ).first()
    if found is None:
        return None
    row, api_key = found
    return DashboardSession(
        id=row.id,
        api_key_id=api_key.id,
        key_digest=api_key.digest,
        tenant_id=api_key.tenant_id,
        csrf_token=row.csrf_token,
    )


def end_session(session: Session, session_id: str, *, now: dt.datetime | None = None) -> bool:
    """Logout: False if the session had already ended."""
    ended = changed_rows(
        session,
        update(UiSession)
        .where(UiSession.id == session_id, UiSession.ended_at.is_(None))
        .values(ended_at=now or utcnow())
        .execution_options(synchronize_session=False),
    )
    return bool(ended)


def end_sessions_of_key(session: Session, api_key_id: str, *, now: dt.datetime | None = None) -> int:
    """Key revocation: every live session of the key ends (lookups refuse them anyway)."""
    return changed_rows(
        session,
        update(UiSession)
        .where(UiSession.api_key_id == api_key_id, UiSession.ended_at.is_(None))
        .values(ended_at=now or utcnow())
        .execution_options(synchronize_session=False),
    )


def purge_old_sessions(session: Session, *, now: dt.datetime | None = None) -> int:
    """Delete sessions ended or expired more than PURGE_AFTER ago (they can never be used again)."""
    cutoff = (now or utcnow()) - PURGE_AFTER
    return changed_rows(
        session,
        delete(UiSession)
        .where(or_(UiSession.ended_at < cutoff, UiSession.expires_at < cutoff))
        .execution_options(synchronize_session=False),
    )
