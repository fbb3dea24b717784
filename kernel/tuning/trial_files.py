"""Where a slot leaves a tuning trial's trained model for whoever closes the tuning.

A file's name is random: one that carried the trial's place in the order of drawing (as it once
did) would count the trials to anyone who lists the store. Torch-free: the reconciler discards
the files of trials whose tuning ended, and may close a tuning itself.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from kernel.storage.blobs import BlobStore, StorageUnavailable
from kernel.tuning.trial_queue import TakenTrial

__all__ = ["TrialFiles"]

log = logging.getLogger("privtrain.tuning")


@dataclass(frozen=True)
class TrialFiles:
    """A trial's trained model on its way to the tuning's closer: a private file (never served), on
    worker storage and, with an object store, in its private area (so the closer may run on another
    host); kept only while it may win, and deleted with the trial queue when the job settles."""

    folder: Path
    blobs: BlobStore

    @staticmethod
    def name(trial: TakenTrial) -> str:
        """The job's id (so a host's leftovers can be matched to settled jobs) and 128 random bits."""
        return f"{trial.job_id}.trial-{secrets.token_hex(16)}.safetensors"

    def keep(self, name: str, source: Path) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        shutil.move(source, path)
        try:
            self.blobs.save_private(name, path)
        except StorageUnavailable:
            path.unlink(missing_ok=True)
            raise
        if self.blobs.private_files_elsewhere:  # the store holds the copy; this host keeps none
            path.unlink(missing_ok=True)

    def fetch(self, name: str) -> Path:
        path = self.folder / name
        if path.exists() or self.blobs.fetch_private(name, path):
            return path
        raise StorageUnavailable(f"trial model {name} is missing")

    def discard(self, names: list[str]) -> None:
        for name in names:
            (self.folder / name).unlink(missing_ok=True)
            try:
                self.blobs.delete_private(name)
            except StorageUnavailable:  # secret but never released; it stays in the store's private area
                log.warning("could not delete a trial's model from the store")
