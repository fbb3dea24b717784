"""What every part of a worker's job shares: the service's settings and stores, the kernel's side
of a job (kernel/job_run.py), who this worker is, and the device it trains on."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from kernel.config import Settings
from kernel.datasets.deletion import DatasetEraser
from kernel.db.engine import Database
from kernel.job_run import JobRun
from kernel.jobs.dispatch import Dispatcher, dispatch_with_settings
from kernel.jobs.private_files import JobPrivateFiles
from kernel.storage.blobs import BlobStore
from kernel.tuning.trial_files import TrialFiles

__all__ = ["WorkerContext", "device_label", "training_device"]

log = logging.getLogger("privtrain.worker")


def training_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_label(device: torch.device) -> str:
    """The device a job ran on, as its report names it (e.g. "NVIDIA H100 80GB HBM3", "cpu")."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    kernel: JobRun
    """The kernel's side of each job: its one entry point for what the worker asks of it."""
    dispatcher: Dispatcher | None
    """Sends the next queued job or tuning slot once this worker has taken one (fair sharing,
    kernel/jobs/dispatch.py); None in tests that run jobs in process."""
    tmp_dir: Path
    """Where model files are written before they are stored."""

    @classmethod
    def build(cls, settings: Settings, *, db: Database | None, dispatcher: Dispatcher | None) -> WorkerContext:
        kernel = JobRun.build(settings, db=db, actor=_actor())
        return cls(settings=settings, kernel=kernel, dispatcher=dispatcher, tmp_dir=settings.tmp_dir)

    @property
    def db(self) -> Database:
        return self.kernel.db

    @property
    def blobs(self) -> BlobStore:
        return self.kernel.blobs

    @property
    def private_files(self) -> JobPrivateFiles:
        return self.kernel.private_files

    @property
    def trial_files(self) -> TrialFiles:
        return self.kernel.trial_files

    @property
    def eraser(self) -> DatasetEraser:
        return self.kernel.eraser

    @property
    def actor(self) -> str:
        return self.kernel.actor

    def send_next(self) -> None:
        """This worker's broker slot is free: let the next job in, chosen fairly."""
        if self.dispatcher is None:
            return
        try:
            dispatch_with_settings(self.db, self.dispatcher, self.settings)
        except Exception:  # the API and the reconciler send it otherwise
            log.exception("could not send the next job")
