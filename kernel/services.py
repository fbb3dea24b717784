"""Process-wide services the routers depend on, built once in ``create_app``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.storage.blobs import BlobStore
from kernel.storage.configured import blob_store_from_settings


class JobDispatcher(Protocol):
    """Sends a job to the workers; called only after the admission transaction committed."""

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None: ...

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None: ...


class CeleryDispatcher:
    """Sends by task name so the API never imports the worker's torch code."""

    def __init__(self, settings: Settings) -> None:
        from kernel.queue import RUN_JOB_TASK, RUN_SLOT_TASK, create_celery  # Celery loads only where built

        self._task = RUN_JOB_TASK
        self._slot_task = RUN_SLOT_TASK
        self._celery = create_celery(settings)
        self._queue = settings.task_queue

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None:
        """To the job's queue (kernel/jobs/routing.py); the GPU queue for jobs admitted before queues."""
        self._celery.send_task(self._task, args=[job_id], task_id=job_id, queue=queue or self._queue)

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None:
        """One slot of a tuning, on the tuning job's queue (kernel/tuning/slots.py)."""
        self._celery.send_task(
            self._slot_task,
            args=[job_id, attempt, slot],
            task_id=f"{job_id}.slot.{attempt}.{slot}",
            queue=queue or self._queue,
        )

    def ping(self) -> None:
        with self._celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)


@dataclass
class Services:
    settings: Settings
    db: Database
    blobs: BlobStore
    dispatcher: JobDispatcher


def build_services(settings: Settings, dispatcher: JobDispatcher | None = None) -> Services:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)
    return Services(
        settings=settings,
        db=Database(settings.resolved_database_url),
        blobs=blob_store_from_settings(settings),
        dispatcher=dispatcher or CeleryDispatcher(settings),
    )
