"""Idempotency keys: a retried request answers with what its first attempt created.

Dataset uploads, base-model uploads and job submissions all take an ``Idempotency-Key`` header. The row they create
records the key and a digest of the request; a unique constraint on (tenant, key) makes the
database the arbiter. Two steps, shared by both:

* :func:`earlier` — before doing any work: the row an earlier request with this key created, or
  :class:`IdempotencyKeyReused` if that request asked for something else.
* :func:`create_once` — around the creating transaction: if a concurrent request with the same
  key committed first (the unique constraint fires, or the caller's own duplicate check does),
  answer as that request's replay instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernel.db.engine import Database
from kernel.db.orm import BaseModelRecord, Dataset, Job, TuningJob
from kernel.errors import InvalidInput

__all__ = ["IdempotencyKeyReused", "IdempotentRequest", "create_once", "earlier"]

Row = TypeVar("Row", Job, Dataset, BaseModelRecord, TuningJob)
T = TypeVar("T")


class IdempotencyKeyReused(InvalidInput):
    """The key was used before with a different request; nothing was created."""

    def __init__(self, what: str) -> None:
        super().__init__(slug="idempotency-key-reused", detail=f"this Idempotency-Key was used with a different {what}")


@dataclass(frozen=True)
class IdempotentRequest:
    """Who asked, under which key (None: no key, nothing to replay), and the request's digest."""

    tenant_id: str
    key: str | None
    request_hash: str
    what: str
    """How the refusal names the request: "request body", "upload"."""


def earlier(session: Session, model: type[Row], request: IdempotentRequest) -> Row | None:
    """The row a request with this key created before; raises :class:`IdempotencyKeyReused` if
    that request differed. None without a key or when the key is new."""
    if not request.key:
        return None
    existing = session.scalar(
        select(model).where(model.tenant_id == request.tenant_id, model.idempotency_key == request.key)
    )
    if existing is not None and existing.request_hash != request.request_hash:
        raise IdempotencyKeyReused(request.what)
    return existing


def create_once(
    db: Database,
    model: type[Row],
    request: IdempotentRequest,
    *,
    create: Callable[[], T],
    replay: Callable[[Session, Row], T],
    lost_race: tuple[type[Exception], ...] = (),
) -> T:
    """``create()``, or — when it fails because a concurrent request with the same key won
    (IntegrityError, or one of ``lost_race``) — ``replay`` of the row that request created.
    Without a key, or when no such row exists, the failure propagates unchanged."""
    race_errors: tuple[type[Exception], ...] = (IntegrityError, *lost_race)
    try:
        return create()
    except race_errors:
        if not request.key:
            raise
        with db.read_session() as session:
            existing = earlier(session, model, request)
            if existing is None:
                raise
            return replay(session, existing)
