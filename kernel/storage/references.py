"""Which rows use a content-addressed blob, and the one safe way to delete a blob nobody uses.

Blobs are stored by content hash, so two uploads (any tenant, any kind: a dataset, its decoded
image array or token ids, a base model, a tokenizer, a job's model) may share one. Whoever
wrote a blob and then failed must not delete it if a committed row now uses it: the rows
decide, under a lock on the key.
"""

from __future__ import annotations

import hashlib
import logging

from sqlalchemy import ColumnElement, select, text
from sqlalchemy.orm import InstrumentedAttribute, Session

from kernel.datasets.status import DatasetStatus
from kernel.db.engine import Database
from kernel.db.orm import BaseModelRecord, Dataset, Job, TokenizerRecord
from kernel.storage.blobs import BlobStore

__all__ = ["blob_is_referenced", "discard_unreferenced_blob", "lock_blob_key"]

log = logging.getLogger("privtrain.blobs")

BLOB_COLUMNS = (
    Dataset.blob_key,
    Dataset.array_blob_key,
    BaseModelRecord.blob_key,
    Job.model_blob,
    TokenizerRecord.blob_key,
)
"""Every column that names a blob: a new kind of stored file must be added here."""

_LIVE: dict[str, ColumnElement[bool]] = {"datasets": Dataset.status != DatasetStatus.DELETED}
"""Which rows of a table hold their blobs: a deleted dataset (a tombstone) holds none, its
``blob_key`` only records what was erased."""


def lock_blob_key(session: Session, key: str) -> None:
    """Serialise registrations and clean-ups of one content-addressed blob until commit.

    On PostgreSQL a transaction-scoped advisory lock on the key: a clean-up cannot check "no row
    uses this blob" and then delete it while another upload of the same bytes (any tenant) commits
    its row in between. SQLite's write transactions are already serialised (BEGIN IMMEDIATE).
    """
    if session.get_bind().dialect.name == "postgresql":
        lock_id = int.from_bytes(hashlib.sha256(f"blob:{key}".encode()).digest()[:8], "big", signed=True)
        session.execute(text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": lock_id})


def _users(column: InstrumentedAttribute[str] | InstrumentedAttribute[str | None], key: str) -> ColumnElement[bool]:
    live = _LIVE.get(column.class_.__tablename__)
    return column == key if live is None else (column == key) & live


def blob_is_referenced(session: Session, key: str, *, ignoring_dataset: str | None = None) -> bool:
    """Whether a live row uses the blob; ``ignoring_dataset``: not counting that dataset's own
    columns (the one being erased)."""
    for column in BLOB_COLUMNS:
        query = select(column).where(_users(column, key))
        if ignoring_dataset is not None and column.class_ is Dataset:
            query = query.where(Dataset.id != ignoring_dataset)
        if session.scalar(query.limit(1)) is not None:
            return True
    return False


def discard_unreferenced_blob(db: Database, blobs: BlobStore, *, key: str) -> None:
    """Delete a blob a failed request wrote, unless a committed row uses it.

    The check and the delete share one write transaction under the key's lock. If the check
    itself fails the blob is kept: a stray blob is harmless, a registered row without its bytes
    is not.
    """
    try:
        with db.write_transaction() as session:
            lock_blob_key(session, key)
            if not blob_is_referenced(session, key):
                blobs.delete(key)
    except Exception:
        log.warning("could not check whether blob %s is referenced; kept", key, exc_info=True)
