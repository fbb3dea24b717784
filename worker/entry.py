"""Entry point for ``celery -A worker.entry worker``: the queue's Celery app (app.queue) plus
this package's task module, built from the environment."""

from celery.signals import setup_logging, worker_init

from app.config import get_settings
from app.logging_setup import configure_logging
from app.queue import create_celery
from worker.parent_watch import start_from_environment
from worker.warmup import warm_up


@setup_logging.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _configure_logging(**_: object) -> None:
    configure_logging(get_settings().log_level)


@worker_init.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _stop_with_parent(**_: object) -> None:
    """Started by ``serve``: stop when it is gone, even if it was SIGKILLed (worker/parent_watch.py)."""
    start_from_environment()


@worker_init.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _warm_up(**_: object) -> None:
    """One-time imports and the CUDA context before the first job (worker/warmup.py)."""
    warm_up()


app = create_celery(get_settings(), include=("worker.tasks",))
