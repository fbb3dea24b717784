"""A running job's secret state on worker storage: its checkpoint and its hold-out split.

Never served, never released; they exist so that a retry resumes inside the same reservation.
They go when the job settles: its worker deletes them, the reconciler deletes those of a job it
fails (its worker is gone), and a worker starting up deletes what a lost worker left on its host
for jobs that have settled since. Torch-free, for the reconciler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from kernel.db.engine import Database
from kernel.db.orm import Job
from kernel.jobs.status import TERMINAL_STATUSES
from kernel.storage.blobs import BlobStore, StorageUnavailable
from privtrain_common.atomic_files import unfinished_writes

__all__ = ["CHECKPOINT_SUFFIX", "HOLDOUT_SUFFIX", "PRIVATE_SUFFIXES", "JobPrivateFiles"]

log = logging.getLogger("privtrain.private_files")

CHECKPOINT_SUFFIX = ".safetensors"
HOLDOUT_SUFFIX = ".holdout.npy"
PRIVATE_SUFFIXES = (CHECKPOINT_SUFFIX, HOLDOUT_SUFFIX)
TRIAL_MARK = ".trial-"
"""A tuning trial's model (kernel/tuning/trial_files.py): its trial queue owns it, not this module."""


@dataclass(frozen=True)
class JobPrivateFiles:
    """The private files of jobs in ``folder`` (worker storage) and their copies in the store's
    private area (with an object store, so that a retry on another host finds them)."""

    folder: Path
    blobs: BlobStore

    def path(self, job_id: str, suffix: str) -> Path:
        return self.folder / f"{job_id}{suffix}"

    def keep(self, job_id: str, suffix: str) -> None:
        """Copy a private file to the store; a failure is logged (this host keeps its copy, and a
        retry elsewhere starts over inside the reservation)."""
        try:
            self.blobs.save_private(f"{job_id}{suffix}", self.path(job_id, suffix))
        except StorageUnavailable:
            log.warning("could not copy private state to the store", extra={"job_id": job_id, "file": suffix})

    def fetch(self, job_id: str, suffix: str) -> bool:
        """Whether the file is on this host, fetched from the store when an earlier attempt ran
        on another host."""
        path = self.path(job_id, suffix)
        if path.exists():
            return True
        if self.blobs.fetch_private(f"{job_id}{suffix}", path):
            log.info("private state fetched from the store", extra={"job_id": job_id, "file": suffix})
            return True
        return False

    def discard(self, job_id: str) -> None:
        """Delete the job's private files here and in the store, with the temp files a worker
        killed mid-write left beside them."""
        for suffix in PRIVATE_SUFFIXES:
            path = self.path(job_id, suffix)
            for leftover in (path, *unfinished_writes(path)):
                leftover.unlink(missing_ok=True)
            try:
                self.blobs.delete_private(f"{job_id}{suffix}")
            except StorageUnavailable:  # secret but never released; it stays in the store's private area
                log.warning("could not delete a private file from the store", extra={"job_id": job_id})

    def erase(self, job_ids: Iterable[str]) -> None:
        """Delete every private file of these jobs, here and in the store: checkpoints, hold-out
        splits, tuning trials' models and killed writes' temp files. Unlike :meth:`discard`, a
        store that fails raises :class:`StorageUnavailable`: an erasure is retried until it is done.
        One listing of the folder and of the store's private area, whatever the number of jobs."""
        wanted = set(job_ids)
        if not wanted:
            return
        if self.folder.is_dir():
            for entry in self.folder.iterdir():
                if entry.name.removeprefix(".").partition(".")[0] in wanted:
                    entry.unlink(missing_ok=True)
        for name in self.blobs.private_names():
            if name.partition(".")[0] in wanted:
                self.blobs.delete_private(name)

    def jobs_on_disk(self) -> set[str]:
        """The ids of jobs with a private file (or a killed write's temp file) in the folder."""
        if not self.folder.is_dir():
            return set()
        ids = set()
        for entry in self.folder.iterdir():
            name = entry.name.removeprefix(".")
            job_id, dot, _ = name.partition(".")
            if dot and TRIAL_MARK not in name and any(f"{job_id}{suffix}" in name for suffix in PRIVATE_SUFFIXES):
                ids.add(job_id)
        return ids

    def discard_settled(self, db: Database) -> list[str]:
        """Discard the files of jobs that have settled (or no longer exist); return their ids."""
        on_disk = self.jobs_on_disk()
        if not on_disk:
            return []
        settled = sorted(on_disk - _unsettled(db, on_disk))
        for job_id in settled:
            self.discard(job_id)
        if settled:
            log.info("private files of settled jobs deleted", extra={"jobs": len(settled)})
        return settled


def _unsettled(db: Database, job_ids: Iterable[str]) -> set[str]:
    with db.read_session() as session:
        rows = session.scalars(select(Job.id).where(Job.id.in_(list(job_ids)), Job.status.not_in(TERMINAL_STATUSES)))
        return set(rows)
