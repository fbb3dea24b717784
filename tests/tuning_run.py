"""Running a private tuning in this process, as the workers would: the job opens it (draws K and
creates its slots), then every slot runs on a JobRunner of its own in a thread, as on several
workers at once. Slots wait out their fixed length, so tests keep it short."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select

from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, TuningSlot
from tests.conftest import make_settings
from worker.runner import JobRunner

TRIAL_TIME_LIMIT_S = 3.0
"""Per trial: far above a trial of the tiny test models (well under a second), even on a busy machine."""

SHORT_SLOTS: dict[str, object] = {"heartbeat_interval_s": 0.1}
"""Settings for tests that run tunings: a slot lasts TRIAL_TIME_LIMIT_S + make_settings' 2 s margin,
and a cancel is noticed within 0.1 s."""


def tuning_settings(data_dir: Path, **overrides: object) -> Settings:
    settings = make_settings(data_dir, max_upload_bytes=5_000_000, **{**SHORT_SLOTS, **overrides})
    migrate(settings)
    return settings


def tuning_request(dataset_id: str, **trials: object) -> dict[str, Any]:
    """A small tuning on the digits: logistic regression, 6 configurations, at most 3 trials."""
    return {
        "base": {
            "dataset_id": dataset_id,
            "model": {"name": "logistic-regression", "params": {}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
            "privacy": {"target_epsilon": 1.0},
            "training": {"steps": 5, "batch_size": 64, "learning_rate": 0.5, "time_limit_s": TRIAL_TIME_LIMIT_S},
            "evaluation": {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.5},
        },
        "search_space": {"training.learning_rate": [0.05, 0.5, 2.0], "training.steps": [5, 10]},
        "trials": trials or {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }


def slots_of(database: Database, job_id: str) -> list[tuple[int, int]]:
    """(attempt, slot) of every slot the job's tuning has."""
    with database.read_session() as session:
        rows = session.execute(
            select(TuningSlot.attempt, TuningSlot.slot).where(TuningSlot.job_id == job_id).order_by(TuningSlot.slot)
        ).all()
    return [(attempt, slot) for attempt, slot in rows]


def run_slots(settings: Settings, database: Database, job_id: str) -> dict[int, str]:
    """Every slot of the opened tuning, each on its own runner in a thread; their answers by slot."""
    answers: dict[int, str] = {}

    def run(attempt: int, slot: int) -> None:
        answers[slot] = JobRunner(settings, db=database).run_slot(job_id, attempt=attempt, slot=slot)

    threads = [threading.Thread(target=run, args=pair) for pair in slots_of(database, job_id)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return answers


def run_tuning(settings: Settings, database: Database, job_id: str) -> str:
    """Open the tuning's job and run all its slots; the job's status afterwards (or the opener's
    answer when it did not open)."""
    opened = JobRunner(settings, db=database).run(job_id)
    if opened != "opened":
        return opened
    run_slots(settings, database, job_id)
    with database.read_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status
