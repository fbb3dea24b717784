"""Celery tasks: thin wrappers that pass ids, never objects."""

from __future__ import annotations

from functools import lru_cache

from celery import shared_task

from app.config import get_settings
from worker.runner import JobRunner


@lru_cache(maxsize=1)
def _runner() -> JobRunner:
    return JobRunner(get_settings())


@shared_task(name="privtrain.run_job", acks_late=True, ignore_result=True)
def run_job(job_id: str) -> str:
    return _runner().run(job_id)
