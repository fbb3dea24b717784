"""Entry point for ``celery -A worker.entry worker``: the queue's Celery app (app.queue) plus
this package's task module, built from the environment."""

from celery.signals import setup_logging, worker_init

from app.config import get_settings
from app.logging_setup import configure_logging
from app.queue import create_celery
from worker.parent_watch import start_from_environment


@setup_logging.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _configure_logging(**_: object) -> None:
    configure_logging(get_settings().log_level)


@worker_init.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _stop_with_parent(**_: object) -> None:
    """Started by ``serve``: stop when it is gone, even if it was SIGKILLed (worker/parent_watch.py)."""
    start_from_environment()


app = create_celery(get_settings(), include=("worker.tasks",))
