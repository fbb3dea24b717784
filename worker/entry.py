"""Entry point for ``celery -A worker.entry worker``: builds the worker app from the environment."""

from celery.signals import setup_logging

from app.config import get_settings
from app.logging_setup import configure_logging
from worker.celery_app import create_worker_celery


@setup_logging.connect
def _configure_logging(**_: object) -> None:
    configure_logging(get_settings().log_level)


app = create_worker_celery()
