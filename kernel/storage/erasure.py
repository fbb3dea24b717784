"""Erasing a content-addressed blob on an owner's request, from the store and every host's cache.

Blobs are shared by content (kernel/storage/references.py): an erasure drops the requester's own
references and deletes the blob only when no live row uses it any more, under the key's lock, so
that an upload of the same bytes committing meanwhile keeps its blob. An erased key is recorded
(``erased_blobs``: keys only) so that hosts holding a cached copy (workers of an object store)
evict it: :func:`evict_erased_copies` runs after each job, periodically on every worker, and in
the reconciler's rounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.db.engine import Database
from kernel.db.orm import ErasedBlob, utcnow
from kernel.storage.blobs import BlobStore
from kernel.storage.references import blob_is_referenced, lock_blob_key

__all__ = ["erase_blob", "evict_erased_copies"]

log = logging.getLogger("privtrain.erasure")

_IN_CHUNK = 500
"""Keys per ``IN (…)`` query (SQLite allows 999 parameters by default)."""


def erase_blob(
    db: Database,
    blobs: BlobStore,
    *,
    key: str,
    release: Callable[[Session], None] = lambda _session: None,
    ignoring_dataset: str | None = None,
) -> bool:
    """``release`` the caller's references to ``key`` and delete the blob if no live row uses it
    (``ignoring_dataset``: that dataset's own columns do not count). True when it was deleted.

    One write transaction: if the store fails (StorageUnavailable propagates), the release is
    rolled back with it and the erasure can be retried; if the process dies after the delete but
    before the commit, the retry finds the blob gone and commits (deleting is idempotent).
    """
    with db.write_transaction() as session:
        lock_blob_key(session, key)
        release(session)
        session.flush()
        if blob_is_referenced(session, key, ignoring_dataset=ignoring_dataset):
            return False
        blobs.delete(key)
        session.merge(ErasedBlob(key=key, erased_at=utcnow()))
    return True


def evict_erased_copies(db: Database, blobs: BlobStore) -> int:
    """Remove this host's cached copies of erased blobs that no live row uses again; how many."""
    cached = blobs.cached_keys()
    if not cached:
        return 0
    stale: list[str] = []
    with db.read_session() as session:
        for start in range(0, len(cached), _IN_CHUNK):
            chunk = cached[start : start + _IN_CHUNK]
            erased = session.scalars(select(ErasedBlob.key).where(ErasedBlob.key.in_(chunk)))
            stale.extend(key for key in erased if not blob_is_referenced(session, key))
    for key in stale:
        blobs.discard_cached(key)
    if stale:
        log.info("cached copies of erased blobs evicted", extra={"blobs": len(stale)})
    return len(stale)
