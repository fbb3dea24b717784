"""A settled job's privacy report: staged in its settling transaction, uploaded after the commit.

Why an outbox: the transaction that settles a job holds its dataset's budget row, and every
admission on that dataset waits for that row. Uploading the report there let a slow object store
stall them all. The report is built in the transaction (it states the ledger around the commit, read
under the same lock) and its bytes are stored beside the job (``pending_reports``); blobs are
content-addressed, so the job row gets its report's key at once. Whoever settled the job delivers
the upload right after the commit; the reconciler delivers whatever a crash left pending, and the
report endpoint serves a pending report from its row. A report is never lost and never missing
from the job's view, even while the store is down.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from kernel.db.engine import Database
from kernel.db.orm import PendingReport
from kernel.storage.blobs import BlobStore

log = logging.getLogger("privtrain.reports")

DELIVERIES_PER_ROUND = 100
"""How many pending reports one :func:`deliver` uploads at most (the reconciler's round stays short)."""


def report_body(report: Mapping[str, Any]) -> bytes:
    """The stored form of a report: indented JSON, with no NaN or infinity (they are not JSON)."""
    return json.dumps(report, indent=2, allow_nan=False).encode()


def stage(tx: Session, *, job_id: str, report: Mapping[str, Any]) -> str:
    """Store ``report`` beside the job in the settling transaction ``tx``; returns its blob key."""
    body = report_body(report)
    key = BlobStore.key_for(hashlib.sha256(body).hexdigest())
    tx.merge(PendingReport(job_id=job_id, blob_key=key, body=body))
    return key


def deliver(db: Database, blobs: BlobStore, *, job_id: str | None = None) -> int:
    """Upload pending reports (``job_id``'s only, or the oldest few) and drop their rows; returns
    how many were delivered. Outside any budget lock. A failed upload stays pending for the next
    delivery (logged); two deliveries of the same report store the same blob."""
    query = select(PendingReport.job_id, PendingReport.blob_key, PendingReport.body)
    query = query.where(PendingReport.job_id == job_id) if job_id is not None else query
    with db.read_session() as session:
        pending = session.execute(query.order_by(PendingReport.created_at).limit(DELIVERIES_PER_ROUND)).all()
    delivered = 0
    for pending_job, key, body in pending:
        try:
            stored, _ = blobs.put_bytes(body)
        except Exception:
            log.warning("a report's upload failed; it stays pending", extra={"job_id": pending_job}, exc_info=True)
            continue
        if stored != key:  # content addressing makes them equal; a mismatch is a bug, never dropped
            log.error("a pending report's key differs from its content's", extra={"job_id": pending_job})
            continue
        with db.write_transaction() as tx:
            tx.execute(delete(PendingReport).where(PendingReport.job_id == pending_job, PendingReport.blob_key == key))
        delivered += 1
    return delivered


def has_pending(db: Database) -> bool:
    """Whether any report waits for its upload (the reconciler's cheap check each round)."""
    with db.read_session() as session:
        return session.scalar(select(PendingReport.job_id).limit(1)) is not None


def pending_body(session: Session, job_id: str) -> bytes | None:
    """The report of ``job_id`` still waiting for its upload, if it is."""
    return session.scalar(select(PendingReport.body).where(PendingReport.job_id == job_id))


def read_report(session: Session, blobs: BlobStore, *, job_id: str, key: str) -> dict[str, Any]:
    """A job's stored report: from its pending row while the upload waits, else from the store."""
    body = pending_body(session, job_id)
    if body is None:
        body = blobs.local_path(key).read_bytes()
    report: dict[str, Any] = json.loads(body)
    return report
