"""Content digests for datasets registered before they existed (``privtrain-admin content-digests``).

Migration 0016 cannot parse stored uploads in SQL, so those rows start with ``content_digest``
NULL and are recognised by the bytes' SHA-256 only (the rule before digests). This operator command
reads each stored upload once and fills the column, after which the same rows re-encoded (CRLF, a
trailing newline, reordered rows or columns) are recognised too. A deletion computes it as well,
before the upload is erased. It also lists live datasets of one tenant that turn out to hold the
same rows: registered twice before digests, each with its own budget, which the owner should know.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select, update

from kernel.datasets.content_identity import ContentUnreadable, content_digest
from kernel.datasets.status import DatasetStatus
from kernel.db.engine import Database
from kernel.db.orm import Dataset
from kernel.ingest.limits import IngestLimits
from kernel.storage.blobs import BlobStore

__all__ = ["BackfillResult", "backfill_content_digests"]

log = logging.getLogger("privtrain.content")


@dataclass
class BackfillResult:
    computed: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Datasets whose upload is missing or no longer parses: their bytes' SHA-256 stays their identity."""
    same_rows: list[tuple[str, ...]] = field(default_factory=list)
    """Groups of one tenant's live datasets that hold the same rows."""


def backfill_content_digests(db: Database, blobs: BlobStore, *, limits: IngestLimits) -> BackfillResult:
    result = BackfillResult()
    with db.read_session() as session:
        pending = session.execute(
            select(Dataset.id, Dataset.format, Dataset.blob_key).where(
                Dataset.content_digest.is_(None), Dataset.status != DatasetStatus.DELETED
            )
        ).all()
    for dataset_id, fmt, key in pending:
        try:
            digest = content_digest(blobs.local_path(key), fmt=fmt, limits=limits)
        except (FileNotFoundError, ContentUnreadable):
            result.unreadable.append(dataset_id)
            continue
        with db.write_transaction() as tx:
            tx.execute(
                update(Dataset)
                .where(Dataset.id == dataset_id, Dataset.content_digest.is_(None))
                .values(content_digest=digest)
            )
        result.computed.append(dataset_id)
    groups: defaultdict[tuple[str, str], list[str]] = defaultdict(list)
    with db.read_session() as session:
        rows = session.execute(
            select(Dataset.tenant_id, Dataset.content_digest, Dataset.id)
            .where(Dataset.content_digest.is_not(None), Dataset.status != DatasetStatus.DELETED)
            .order_by(Dataset.created_at, Dataset.id)
        ).all()
    for tenant_id, stored, dataset_id in rows:
        groups[(tenant_id, str(stored))].append(dataset_id)
    result.same_rows = [tuple(ids) for ids in groups.values() if len(ids) > 1]
    log.info(
        "content digests computed",
        extra={"computed": len(result.computed), "unreadable": len(result.unreadable)},
    )
    return result
