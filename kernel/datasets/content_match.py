"""Which of a tenant's datasets hold an upload's content: one content, one budget
(docs/privacy-model.md §3), so a live match refuses the upload and a deleted one continues its ledger."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from kernel.datasets.status import DatasetStatus
from kernel.datasets.upload_refusals import ContentAlreadyRegistered, DeletedContentWasPrivate
from kernel.db.engine import Database
from kernel.db.orm import Dataset

__all__ = ["ContentMatch", "match_content", "refuse_known_content", "same_content"]


def _registered_with_bytes(session: Session, tenant_id: str, sha256: str) -> Dataset | None:
    """A live (not deleted) dataset of the tenant uploaded as these very bytes."""
    return session.scalar(
        select(Dataset)
        .where(Dataset.tenant_id == tenant_id, Dataset.sha256 == sha256, Dataset.status != DatasetStatus.DELETED)
        .order_by(Dataset.created_at, Dataset.id)
        .limit(1)
    )


def refuse_known_content(db: Database, tenant_id: str, sha256: str) -> None:
    """Early, cheap check before parsing (the same bytes are the same rows); the binding check, by
    content digest, runs again under the tenant lock."""
    with db.read_session() as session:
        existing = _registered_with_bytes(session, tenant_id, sha256)
        if existing is not None:
            raise ContentAlreadyRegistered(existing)


def same_content(tenant_id: str, *, digest: str, sha256: str) -> ColumnElement[bool]:
    """SQL filter: the tenant's datasets with this content. Datasets registered before the digest
    existed (``content_digest`` NULL, until backfilled) are recognised by their bytes' SHA-256."""
    return and_(
        Dataset.tenant_id == tenant_id,
        or_(Dataset.content_digest == digest, and_(Dataset.content_digest.is_(None), Dataset.sha256 == sha256)),
    )


@dataclass(frozen=True)
class ContentMatch:
    live: Dataset | None
    """Registered (active, or still being deleted): the upload is refused."""
    tombstone: Dataset | None
    """Deleted, of the same kind (private or public) as the upload: its ledger continues."""


def match_content(session: Session, tenant_id: str, *, digest: str, sha256: str, public: bool) -> ContentMatch:
    matches = list(
        session.scalars(
            select(Dataset)
            .where(same_content(tenant_id, digest=digest, sha256=sha256))
            .order_by(Dataset.created_at, Dataset.id)
        )
    )
    live = next((d for d in matches if d.status != DatasetStatus.DELETED), None)
    deleted = [d for d in matches if d.status == DatasetStatus.DELETED]
    if public and any(not d.public for d in deleted):
        raise DeletedContentWasPrivate(next(d for d in deleted if not d.public))
    # A private upload of rows once declared public starts a budget of its own: nothing was promised.
    return ContentMatch(live=live, tombstone=next((d for d in deleted if d.public == public), None))
