"""Entry point for ``celery -A worker.entry worker``: the queue's Celery app (kernel.queue) plus
this package's task module, built from the environment."""

import logging
import threading

from celery.signals import setup_logging, worker_init

from kernel.config import get_settings
from kernel.db.engine import Database
from kernel.jobs.private_files import JobPrivateFiles
from kernel.logging_setup import configure_logging
from kernel.queue import create_celery
from kernel.storage.configured import blob_store_from_settings
from kernel.storage.erasure import evict_erased_copies
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


@worker_init.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _delete_settled_private_files(**_: object) -> None:
    """What a lost worker on this host left of jobs that settled since (kernel/jobs/private_files.py)."""
    settings = get_settings()
    db: Database | None = None
    try:
        db = Database(settings.resolved_database_url)
        blobs = blob_store_from_settings(settings)
        JobPrivateFiles(settings.checkpoint_dir, blobs).discard_settled(db)
        evict_erased_copies(db, blobs)
    except Exception:  # housekeeping: the worker starts regardless, and the next start tries again
        logging.getLogger("privtrain.worker").exception("deleting settled jobs' private files failed")
    finally:
        if db is not None:
            db.dispose()


def _sweep_periodically() -> None:
    """Every ``worker_sweep_interval_s``: the private files of jobs settled since, and cached copies
    of blobs an owner's deletion erased (kernel/storage/erasure.py), so a host that runs no job for a
    while keeps neither."""
    settings = get_settings()
    db = Database(settings.resolved_database_url)
    blobs = blob_store_from_settings(settings)
    files = JobPrivateFiles(settings.checkpoint_dir, blobs)
    never = threading.Event()  # the thread is a daemon: it ends with the worker process
    while not never.wait(settings.worker_sweep_interval_s):
        try:
            files.discard_settled(db)
            evict_erased_copies(db, blobs)
        except Exception:  # housekeeping: the next round tries again
            logging.getLogger("privtrain.worker").warning("worker sweep failed", exc_info=True)


@worker_init.connect  # type: ignore[untyped-decorator]  # celery has no type hints
def _start_sweep(**_: object) -> None:
    threading.Thread(target=_sweep_periodically, name="privtrain-worker-sweep", daemon=True).start()


app = create_celery(get_settings(), include=("worker.tasks",))
