"""Celery tasks: thin wrappers that pass ids, never objects."""

from __future__ import annotations

from functools import lru_cache

from celery import shared_task

from kernel.config import get_settings
from kernel.queue import RUN_JOB_TASK, RUN_SLOT_TASK
from kernel.services import CeleryDispatcher
from worker.runner import JobRunner


@lru_cache(maxsize=1)
def _runner() -> JobRunner:
    settings = get_settings()
    dispatcher = CeleryDispatcher(settings)
    return JobRunner(settings, dispatcher=dispatcher)


@shared_task(name=RUN_JOB_TASK, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]  # celery has no type hints
def run_job(job_id: str) -> str:
    return _runner().run(job_id)


@shared_task(name=RUN_SLOT_TASK, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]  # celery has no type hints
def run_tuning_slot(job_id: str, attempt: int, slot: int) -> str:
    return _runner().run_slot(job_id, attempt=attempt, slot=slot)
