"""Entry point for ``celery -A worker.entry worker``: builds the worker app from the environment."""

from celery.signals import setup_logging, worker_init

from app.config import get_settings
from app.logging_setup import configure_logging
from worker.celery_app import create_worker_celery
from worker.parent_watch import start_from_environment


@setup_logging.connect
def _configure_logging(**_: object) -> None:
    configure_logging(get_settings().log_level)


@worker_init.connect
def _stop_with_parent(**_: object) -> None:
    """Started by ``serve``: stop when it is gone, even if it was SIGKILLed (worker/parent_watch.py)."""
    start_from_environment()


app = create_worker_celery()
