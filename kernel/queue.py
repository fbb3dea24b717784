"""The job queue: Celery configuration shared by the API (to send) and the workers (to run).

Imports nothing from torch, so the API image can send tasks without it: the worker adds only its
task module (``worker.entry``). Late acks, prefetch 1, JSON only, one process per GPU, task id =
job id; results live in the database, not in a result backend.
"""

from __future__ import annotations

from pathlib import Path

from celery import Celery

from kernel.config import Settings

RUN_JOB_TASK = "privtrain.run_job"
"""Run a job by id (the API sends it by name, so it never imports the worker)."""

RUN_SLOT_TASK = "privtrain.run_tuning_slot"
"""Run one slot of a tuning: (job id, attempt, slot), sent by fair dispatch (kernel/tuning/slots.py)."""


def _filesystem_options(broker_dir: Path) -> dict[str, object]:
    folders = {name: broker_dir / name for name in ("queue", "processed", "control")}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),  # kombu's default is ./control in the cwd
        "store_processed": False,
    }


def create_celery(settings: Settings, *, include: tuple[str, ...] = ()) -> Celery:
    celery = Celery("privtrain", broker=settings.resolved_broker_url, include=list(include))
    options: dict[str, object] = {"visibility_timeout": settings.redis_visibility_timeout_s}
    if settings.uses_filesystem_broker:
        options = _filesystem_options(settings.broker_dir)
    celery.conf.update(
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        task_ignore_result=True,
        result_backend=None,
        task_default_queue=settings.task_queue,
        task_track_started=False,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=not settings.uses_filesystem_broker,
        worker_send_task_events=False,
        enable_utc=True,
    )
    return celery
