"""Deleting a dataset on its owner's request: stop its jobs, erase its rows everywhere, keep its ledger.

Two steps, each idempotent, so a deletion interrupted anywhere (a crash, an object store outage)
is finished by the next ``DELETE``, by the worker that settles the dataset's last job, or by the
reconciler's next round:

1. **The request** (:func:`request_deletion`): one write transaction under the dataset's budget
   lock, the lock admission, claims, grants and every job transition take. The status becomes
   ``deleting``; every grant and pending invitation ends; every queued job is cancelled (its
   reservation released, or committed whole if a lost attempt had opened the data:
   kernel/jobs/lifecycle.py); every running job is asked to stop (its worker commits the steps it
   ran; a tuning its whole reservation). From then on no job is admitted or claimed on it.
2. **The erasure** (:meth:`DatasetEraser.finish`), only once no job of the dataset is queued or
   running, so that a worker never finds its rows gone mid-run and settles it as a failure. First
   the content digest of a dataset registered before digests existed is computed (a re-upload must
   still continue its ledger), then: every private file of its jobs (checkpoints, hold-out splits,
   tuning trials' models, here and in the store's private area), the uploaded blob and its decoded
   array (kernel/storage/erasure.py: never while another live record uses the same bytes), and, if the
   owner chose so, its jobs' models (each deferred while a job elsewhere starts from it). Then the
   status is ``deleted``: a tombstone. Cached copies on other hosts are evicted by their own sweeps.

What the tombstone keeps (its owner only; analysts lost access at step 1): the id, name and public
facts, the content digest and the bytes' SHA-256 (to recognise the same rows if they come back:
their ledger continues), the budget row and the hash-chained ledger (``privtrain-admin
verify-ledger`` checks it as before), the jobs with their events and reports (numbers released
through accounted mechanisms and public facts: no rows), and the models unless the owner chose to
delete them. docs/privacy-model.md#deleting-a-dataset says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from kernel.access.grants import is_live
from kernel.config import Settings
from kernel.datasets.content_identity import ContentUnreadable, content_digest
from kernel.datasets.status import DatasetStatus, begin_deletion, mark_erased
from kernel.db.engine import Database
from kernel.db.orm import Dataset, DatasetGrant, Job, Tenant, utcnow
from kernel.ingest.limits import IngestLimits
from kernel.jobs import lifecycle
from kernel.jobs.private_files import JobPrivateFiles
from kernel.jobs.status import ACTIVE_STATUSES, JobStatus
from kernel.ledger import operations as ledger
from kernel.schemas.stored_spec import JobStart, StoredJobSpec, parse_stored_spec, stored_spec
from kernel.storage.blobs import BlobStore
from kernel.storage.configured import blob_store_from_settings
from kernel.storage.erasure import erase_blob, evict_erased_copies

__all__ = ["DELETION_REASON", "DatasetEraser", "DeletionProgress", "deletion_progress", "request_deletion"]

log = logging.getLogger("privtrain.deletion")

DELETION_REASON = "dataset-deleted"
"""The reason the cancel events of a deleted dataset's jobs carry (a public code)."""


@dataclass(frozen=True)
class DeletionProgress:
    """Where a deletion stands, as the owner's view of the dataset shows it."""

    status: DatasetStatus
    jobs_settling: int
    """Queued or running jobs still to settle (0 once erased)."""
    models_pending: int
    """Models the owner chose to delete that a job elsewhere still starts from."""


def request_deletion(db: Database, *, dataset_id: str, owner: Tenant, delete_models: bool) -> None:
    """Step 1: mark the dataset ``deleting``, end its grants, cancel its jobs (idempotent).

    Asked again, it changes nothing, except that ``delete_models`` may turn a choice to keep the
    models into deleting them (also after the erasure: the kept models then go); the opposite
    cannot be undone and is ignored.
    """
    actor = f"tenant:{owner.id}"
    with db.write_transaction() as tx:
        ledger.lock_budget(tx, dataset_id)
        dataset = tx.get(Dataset, dataset_id, populate_existing=True)
        assert dataset is not None
        begin_deletion(dataset, now=utcnow(), delete_models=delete_models)
        tx.execute(
            update(DatasetGrant)
            .where(DatasetGrant.dataset_id == dataset_id, is_live())
            .values(revoked_at=utcnow(), revoked_by=owner.id)
        )
        active = tx.execute(
            select(Job.id, Job.status, Job.cancel_requested).where(
                Job.dataset_id == dataset_id, Job.status.in_(ACTIVE_STATUSES)
            )
        ).all()
        for job_id, status, cancel_requested in active:
            if status == JobStatus.QUEUED or not cancel_requested:
                lifecycle.cancel_within(tx, job_id=job_id, dataset_id=dataset_id, actor=actor, reason=DELETION_REASON)
    log.info("dataset deletion requested", extra={"dataset_id": dataset_id, "jobs": len(active)})


def deletion_progress(session: Session, dataset: Dataset) -> DeletionProgress:
    """How far the dataset's deletion has gone (an active dataset: nothing to settle)."""
    status = DatasetStatus(dataset.status)
    if status != DatasetStatus.DELETING:
        return DeletionProgress(status=status, jobs_settling=0, models_pending=0)
    settling = session.scalar(
        select(func.count()).select_from(Job).where(Job.dataset_id == dataset.id, Job.status.in_(ACTIVE_STATUSES))
    )
    models = _models_to_delete(session, dataset) if dataset.delete_models else {}
    return DeletionProgress(
        status=status, jobs_settling=int(settling or 0), models_pending=len(_in_use_as_init(session, models))
    )


def _models_to_delete(session: Session, dataset: Dataset) -> dict[str, str]:
    """Job id → model blob key of the dataset's jobs that still have a model."""
    rows = session.execute(
        select(Job.id, Job.model_blob).where(Job.dataset_id == dataset.id, Job.model_blob.is_not(None))
    )
    return {job_id: key for job_id, key in rows if key is not None}


def _init_job_ids(spec: StoredJobSpec) -> set[str]:
    """The job whose model a job starts from, as requested (``model.init``) and as planned (``init``)."""
    found = set()
    if spec.model.init is not None and spec.model.init.job_id is not None:
        found.add(spec.model.init.job_id)
    if isinstance(spec.init, JobStart):
        found.add(spec.init.job_id)
    return found


def _in_use_as_init(session: Session, job_ids: Iterable[str]) -> set[str]:
    """Those of ``job_ids`` whose model a queued or running job (on any dataset) starts from."""
    wanted = set(job_ids)
    if not wanted:
        return set()
    used: set[str] = set()
    for (spec,) in session.execute(select(Job.spec).where(Job.status.in_(ACTIVE_STATUSES))):
        used |= _init_job_ids(parse_stored_spec(spec)) & wanted
    return used


@dataclass(frozen=True)
class _Snapshot:
    """What the erasure needs, read once no job of the dataset is active."""

    dataset_id: str
    fmt: str
    blob_key: str
    array_blob_key: str | None
    has_digest: bool
    touched_jobs: tuple[str, ...]
    models: dict[str, str]


@dataclass(frozen=True)
class DatasetEraser:
    """Step 2, for the API (after a DELETE), a worker (after settling a job) and the reconciler."""

    db: Database
    blobs: BlobStore
    private_files: JobPrivateFiles
    limits: IngestLimits

    @classmethod
    def from_settings(cls, settings: Settings, *, db: Database, blobs: BlobStore | None = None) -> DatasetEraser:
        store = blobs if blobs is not None else blob_store_from_settings(settings)
        return cls(
            db=db,
            blobs=store,
            private_files=JobPrivateFiles(settings.checkpoint_dir, store),
            limits=IngestLimits.from_settings(settings),
        )

    def finish(self, dataset_id: str) -> DatasetStatus:
        """Erase a ``deleting`` dataset whose jobs have all settled; its status afterwards.

        Raises what the store raises (StorageUnavailable): nothing is lost, the next try resumes.
        """
        snapshot = self._snapshot(dataset_id)
        if not isinstance(snapshot, _Snapshot):
            return snapshot
        if not snapshot.has_digest:
            self._backfill_digest(snapshot)
        self.private_files.erase(snapshot.touched_jobs)
        erase_blob(self.db, self.blobs, key=snapshot.blob_key, ignoring_dataset=dataset_id)
        if snapshot.array_blob_key is not None:
            erase_blob(self.db, self.blobs, key=snapshot.array_blob_key, ignoring_dataset=dataset_id)
        with self.db.read_session() as session:
            in_use = _in_use_as_init(session, snapshot.models)
        for job_id, key in snapshot.models.items():
            if job_id not in in_use:
                erase_blob(self.db, self.blobs, key=key, release=_model_release(job_id, key))
        if in_use:
            log.info("deletion waits for jobs starting from its models", extra={"dataset_id": dataset_id})
            return DatasetStatus.DELETING
        status = self._tombstone(dataset_id)
        evict_erased_copies(self.db, self.blobs)
        return status

    def finish_pending(self) -> list[str]:
        """The reconciler's round: finish every deletion that can be; returns those now deleted."""
        with self.db.read_session() as session:
            pending = list(session.scalars(select(Dataset.id).where(Dataset.status == DatasetStatus.DELETING)))
        done = []
        for dataset_id in pending:
            try:
                if self.finish(dataset_id) == DatasetStatus.DELETED:
                    done.append(dataset_id)
            except Exception:  # the store may be down: the next round tries again
                log.warning("dataset erasure failed; retried later", extra={"dataset_id": dataset_id}, exc_info=True)
        return done

    def after_job(self, job_id: str) -> None:
        """A worker settled ``job_id``: finish the deletion of its dataset (or of the dataset whose
        model it started from) if that waited for it, and evict this host's erased copies."""
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            candidates = {job.dataset_id} if job is not None else set()
            if job is not None:
                for init_job in _init_job_ids(stored_spec(job)):
                    source = session.get(Job, init_job)
                    if source is not None:
                        candidates.add(source.dataset_id)
            deleting = list(
                session.scalars(
                    select(Dataset.id).where(Dataset.id.in_(candidates), Dataset.status == DatasetStatus.DELETING)
                )
            )
        for dataset_id in deleting:
            self.finish(dataset_id)
        evict_erased_copies(self.db, self.blobs)

    # ------------------------------------------------------------------ steps

    def _snapshot(self, dataset_id: str) -> _Snapshot | DatasetStatus:
        with self.db.read_session() as session:
            dataset = session.get(Dataset, dataset_id)
            if dataset is None:
                return DatasetStatus.DELETED
            if dataset.status != DatasetStatus.DELETING:
                return DatasetStatus(dataset.status)
            active = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.dataset_id == dataset_id, Job.status.in_(ACTIVE_STATUSES))
            )
            if active:
                return DatasetStatus.DELETING
            touched = session.scalars(select(Job.id).where(Job.dataset_id == dataset_id, Job.touched_at.is_not(None)))
            return _Snapshot(
                dataset_id=dataset_id,
                fmt=dataset.format,
                blob_key=dataset.blob_key,
                array_blob_key=dataset.array_blob_key,
                has_digest=dataset.content_digest is not None,
                touched_jobs=tuple(sorted(touched)),
                models=_models_to_delete(session, dataset) if dataset.delete_models else {},
            )

    def _backfill_digest(self, snapshot: _Snapshot) -> None:
        """A dataset registered before content digests: compute it from its upload before the
        upload goes, so that the same rows uploaded again still continue its ledger. If the upload
        cannot be read (it is already gone, or no longer parses), the bytes' SHA-256 stands for it."""
        try:
            path = self.blobs.local_path(snapshot.blob_key)
            digest = content_digest(path, fmt=snapshot.fmt, limits=self.limits)
        except (FileNotFoundError, ContentUnreadable):
            log.warning(
                "no content digest for a deleted dataset; its bytes' hash identifies it",
                extra={"dataset_id": snapshot.dataset_id},
            )
            return
        with self.db.write_transaction() as tx:
            tx.execute(
                update(Dataset)
                .where(Dataset.id == snapshot.dataset_id, Dataset.content_digest.is_(None))
                .values(content_digest=digest)
            )

    def _tombstone(self, dataset_id: str) -> DatasetStatus:
        with self.db.write_transaction() as tx:
            ledger.lock_budget(tx, dataset_id)
            dataset = tx.get(Dataset, dataset_id, populate_existing=True)
            assert dataset is not None
            if dataset.status != DatasetStatus.DELETING:
                return DatasetStatus(dataset.status)
            progress = deletion_progress(tx, dataset)
            if progress.jobs_settling or (dataset.delete_models and _models_to_delete(tx, dataset)):
                return DatasetStatus.DELETING  # a concurrent change: the next try finishes it
            mark_erased(dataset, now=utcnow())
        log.info("dataset erased", extra={"dataset_id": dataset_id})
        return DatasetStatus.DELETED


def _model_release(job_id: str, key: str) -> Any:
    def release(session: Session) -> None:
        session.execute(update(Job).where(Job.id == job_id, Job.model_blob == key).values(model_blob=None))

    return release
