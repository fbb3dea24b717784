"""A tuning's trials on several workers (worker/tuning_run.py): helpers take trials beside the
job's own worker, a helper's model can be the one released, a lost helper's trial runs again, and
a settled tuning leaves no trial rows or private model files behind. Workers run in threads of
this process against one database; tests/services/test_tuning_parallel_redis.py runs them as
real processes."""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.config import Settings
from app.db import Database
from app.jobs import lifecycle
from app.ledger_audit import verify_ledger
from app.models import Job, TuningTrial
from app.reconciler import reconcile_once
from app.tuning import trial_queue
from app.tuning.trial_files import TrialFiles
from tests.api.test_api_tuning import _entries, _request
from tests.conftest import RecordingDispatcher, make_settings, upload
from worker.runner import JobRunner

LATER = dt.timedelta(hours=1)


@pytest.fixture
def fast_settings(tmp_path: Path) -> Settings:
    """Heartbeats every 50 ms and a trial stale after 1 s (the lost-worker tests wait that long)."""
    from app.bootstrap import migrate

    settings = make_settings(
        tmp_path / "data", max_upload_bytes=5_000_000, heartbeat_interval_s=0.05, stale_after_s=1.0, max_attempts=2
    )
    migrate(settings)
    return settings


@pytest.fixture
def fast_db(fast_settings: Settings) -> Iterator[Database]:
    db = Database(fast_settings.resolved_database_url)
    yield db
    db.dispose()


@pytest.fixture
def client(fast_settings: Settings, fast_db: Database) -> Iterator[TestClient]:
    from app.main import create_app
    from tests.conftest import new_key

    with TestClient(create_app(fast_settings, dispatcher=RecordingDispatcher())) as client:
        client.headers["Authorization"] = f"Bearer {new_key(fast_db, 'alice')}"
        yield client


@pytest.fixture
def tuning(client: TestClient, digits_csv: bytes) -> dict[str, Any]:
    dataset_id = str(upload(client, digits_csv).json()["id"])  # type: ignore[attr-defined]
    body = client.post("/v1/tuning-jobs", json=_request(dataset_id)).json()
    return {**body, "dataset_id": dataset_id}


def _trial_rows(db: Database) -> int:
    with db.read_session() as session:
        return int(session.scalar(select(func.count()).select_from(TuningTrial)) or 0)


def _trial_files(settings: Settings) -> list[Path]:
    return sorted(settings.checkpoint_dir.glob("*.trial-*")) if settings.checkpoint_dir.exists() else []


@dataclass
class ThreadHelpers:
    """Stands in for Celery: each helper asked for is another JobRunner, in a thread."""

    settings: Settings
    db: Database
    asked: list[tuple[str, int, int]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    results: list[str] = field(default_factory=list)

    def ask_for_trial_helper(self, job_id: str, *, attempt: int, index: int, queue: str | None) -> None:
        self.asked.append((job_id, attempt, index))
        helper = JobRunner(self.settings, db=self.db)
        helper.actor = f"helper-{index}"
        thread = threading.Thread(target=lambda: self.results.append(helper.help_with_trials(job_id, attempt)))
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=120)


def _trials_scored_by_worker(
    scores: dict[str, float],
    ran: list[str],
    *,
    owner_waits: threading.Event | None = None,
    helpers_wait: threading.Event | None = None,
    helper_started: threading.Event | None = None,
) -> Any:
    """A ``_run_trial`` wrapper: the real trial, its accuracy replaced by its worker's score, with
    gates that order the workers where a test needs it (``owner_waits`` before each of the
    owner's trials but its first, ``helpers_wait`` before each helper's; ``helper_started`` set
    when a helper begins one)."""
    real = JobRunner._run_trial

    def run_trial(self: JobRunner, *args: Any, **kwargs: Any) -> Any:
        is_owner = self.actor == "owner"
        if is_owner and owner_waits is not None and "owner" in ran:
            assert owner_waits.wait(60)
        if not is_owner:
            if helper_started is not None:
                helper_started.set()
            if helpers_wait is not None:
                assert helpers_wait.wait(60)
        ran.append(self.actor)
        result = real(self, *args, **kwargs)
        if result is None:
            return None
        metrics, model = result
        return {**metrics, "accuracy": scores.get(self.actor, 0.1)}, model

    return run_trial


def test_helpers_share_the_trials_and_a_helpers_model_can_be_the_one_released(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database, client: TestClient
) -> None:
    helpers = ThreadHelpers(fast_settings, fast_db)
    owner = JobRunner(fast_settings, db=fast_db, helpers=helpers)
    owner.actor = "owner"
    ran: list[str] = []
    kept: dict[str, str] = {}
    real_keep = TrialFiles.keep

    def keep(self: TrialFiles, name: str, source: Path) -> None:
        kept[name] = hashlib.sha256(source.read_bytes()).hexdigest()
        real_keep(self, name, source)

    started = threading.Event()
    trials = _trials_scored_by_worker(
        {"helper-0": 0.99, "helper-1": 0.99, "helper-2": 0.99}, ran, owner_waits=started, helper_started=started
    )
    with (
        mock.patch("app.privacy.sample_trial_count", return_value=8),
        mock.patch.object(JobRunner, "_run_trial", trials),
        mock.patch.object(TrialFiles, "keep", keep),
    ):
        assert owner.run(tuning["job_id"]) == "succeeded"
        helpers.join()
    assert [index for _, _, index in helpers.asked] == [0, 1, 2]  # PRIVTRAIN_TUNING_PARALLEL_TRIALS = 4
    assert len(ran) == 8 and "owner" in ran and set(ran) - {"owner"}  # every trial ran once, on some worker
    assert helpers.results == ["done"] * 3  # the same answer whatever a helper ran: it would tell K
    with fast_db.read_session() as session:
        job = session.get(Job, tuning["job_id"])
        assert job is not None
    # The released model is the helper's best trial: the file it kept, byte for byte.
    assert job.model_sha256 in kept.values() and job.metrics is not None and job.metrics["accuracy"] == 0.99
    assert _trial_rows(fast_db) == 0 and _trial_files(fast_settings) == []
    assert [e.kind for e in _entries(fast_db, tuning["dataset_id"])] == ["RESERVE", "TOUCH", "COMMIT"]
    assert verify_ledger(fast_db, dataset_id=tuning["dataset_id"]).ok
    with mock.patch.object(JobRunner, "_prepare", side_effect=AssertionError("rebuilt")):  # a late helper
        assert JobRunner(fast_settings, db=fast_db).help_with_trials(tuning["job_id"], 1) == "done"


def test_a_helper_keeps_no_model_that_a_finished_trial_already_beats(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database
) -> None:
    """The owner's trials score higher: the helper's models are never needed, so none is kept."""
    helpers = ThreadHelpers(fast_settings, fast_db)
    owner = JobRunner(fast_settings, db=fast_db, helpers=helpers)
    owner.actor = "owner"
    ran: list[str] = []
    started, owner_recorded = threading.Event(), threading.Event()
    real_finish = trial_queue.finish

    def finish(db: Database, *, trial: trial_queue.TakenTrial, **result: Any) -> bool:
        recorded = real_finish(db, trial=trial, **result)
        if trial.worker == "owner":
            owner_recorded.set()
        return recorded

    trials = _trials_scored_by_worker(
        {"owner": 0.9}, ran, owner_waits=started, helpers_wait=owner_recorded, helper_started=started
    )
    with (
        mock.patch("app.privacy.sample_trial_count", return_value=6),
        mock.patch.object(JobRunner, "_run_trial", trials),
        mock.patch("app.tuning.trial_queue.finish", finish),
        mock.patch.object(TrialFiles, "keep", side_effect=AssertionError("kept")) as keep,
    ):
        assert owner.run(tuning["job_id"]) == "succeeded"
        helpers.join()
    assert set(ran) - {"owner"} and keep.call_count == 0
    with fast_db.read_session() as session:
        job = session.get(Job, tuning["job_id"])
        assert job is not None and job.metrics is not None and job.metrics["accuracy"] == 0.9


def test_a_lost_helpers_trial_runs_again_on_the_owner(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database
) -> None:
    taken: list[trial_queue.TakenTrial] = []

    class VanishingHelper:
        """Takes a trial and dies without a word (no heartbeat, no result)."""

        def ask_for_trial_helper(self, job_id: str, *, attempt: int, index: int, queue: str | None) -> None:
            trial = trial_queue.take(fast_db, job_id=job_id, attempt=attempt, worker="vanished")
            assert trial is not None
            taken.append(trial)

    owner = JobRunner(fast_settings, db=fast_db, helpers=VanishingHelper())
    owner.actor = "owner"
    ran: list[str] = []
    with (
        mock.patch("app.privacy.sample_trial_count", return_value=4),
        mock.patch.object(JobRunner, "_run_trial", _trials_scored_by_worker({}, ran)),
    ):
        assert owner.run(tuning["job_id"]) == "succeeded"
    assert len(taken) == 3 and ran == ["owner"] * 4  # the three lost trials ran again on the owner
    entries = _entries(fast_db, tuning["dataset_id"])
    assert [e.kind for e in entries] == ["RESERVE", "TOUCH", "COMMIT"]
    assert verify_ledger(fast_db, dataset_id=tuning["dataset_id"]).ok and _trial_rows(fast_db) == 0


def test_a_trial_lost_on_every_take_fails_the_tuning_with_its_whole_charge(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database, client: TestClient
) -> None:
    class VanishingHelper:
        def ask_for_trial_helper(self, job_id: str, *, attempt: int, index: int, queue: str | None) -> None:
            assert trial_queue.take(fast_db, job_id=job_id, attempt=attempt, worker="vanished") is not None

    owner = JobRunner(fast_settings, db=fast_db, helpers=VanishingHelper())
    real = trial_queue.take

    def take_and_vanish(db: Database, *, job_id: str, attempt: int, worker: str) -> Any:
        trial = real(db, job_id=job_id, attempt=attempt, worker=worker)
        if trial is not None and trial.claims == 2:  # the lost trial's second take: lost again
            return None
        return trial

    with (
        mock.patch("app.privacy.sample_trial_count", return_value=2),
        mock.patch("app.tuning.trial_queue.take", take_and_vanish),
    ):
        assert owner.run(tuning["job_id"]) == "failed"
    view = client.get(f"/v1/tuning-jobs/{tuning['id']}").json()
    assert view["status"] == "failed" and view["error_code"] == "worker-lost"
    entries = _entries(fast_db, tuning["dataset_id"])
    assert [e.kind for e in entries] == ["RESERVE", "TOUCH", "COMMIT"] and entries[-1].curve == entries[0].curve
    assert _trial_rows(fast_db) == 0


def test_a_helper_whose_tuning_was_lost_stops_and_leaves_nothing(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database
) -> None:
    """The owner is lost while a helper trains: the helper's heartbeat stops it; a helper that
    finished just then discards its model; the retry starts over and leaves no row or file."""
    runner = JobRunner(fast_settings, db=fast_db)
    claimed = runner.claim(tuning["job_id"])
    assert claimed is not None
    trial_queue.enqueue(fast_db, job_id=tuning["job_id"], attempt=1, candidates=[0, 1])

    def lose_the_owner() -> None:
        lifecycle.requeue_or_fail(
            fast_db,
            job_id=tuning["job_id"],
            dataset_id=tuning["dataset_id"],
            attempt=1,
            stale_before=dt.datetime.now(dt.UTC) + LATER,
            max_attempts=3,
        )

    real_keep = TrialFiles.keep

    def keep_then_lose(self: TrialFiles, name: str, source: Path) -> None:
        real_keep(self, name, source)
        assert _trial_files(fast_settings)  # kept for a moment …
        lose_the_owner()

    helper = JobRunner(fast_settings, db=fast_db)
    with mock.patch.object(TrialFiles, "keep", keep_then_lose):
        assert helper.help_with_trials(tuning["job_id"], 1) == "done"
    assert _trial_files(fast_settings) == []  # … and discarded when its result could not be recorded
    assert trial_queue.take(fast_db, job_id=tuning["job_id"], attempt=1, worker="late") is None
    with mock.patch("app.privacy.sample_trial_count", return_value=2):
        assert JobRunner(fast_settings, db=fast_db).run(tuning["job_id"]) == "succeeded"
    assert _trial_rows(fast_db) == 0 and _trial_files(fast_settings) == []
    assert verify_ledger(fast_db, dataset_id=tuning["dataset_id"]).ok


def test_the_reconciler_clears_the_trials_of_a_tuning_no_worker_will_settle(
    tuning: dict[str, Any], fast_settings: Settings, fast_db: Database
) -> None:
    # Staleness is set by hand below, never by the clock: with the fixture's 1 s, a loaded machine
    # could see the owner as lost before the first round.
    patient = fast_settings.model_copy(update={"stale_after_s": LATER.total_seconds() / 2})
    assert JobRunner(fast_settings, db=fast_db).claim(tuning["job_id"]) is not None
    trial_queue.enqueue(fast_db, job_id=tuning["job_id"], attempt=1, candidates=[0, 1])
    held = trial_queue.take(fast_db, job_id=tuning["job_id"], attempt=1, worker="helper")
    assert held is not None
    name = TrialFiles.name(held)
    fast_settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (fast_settings.checkpoint_dir / name).write_bytes(b"a trial's model")
    assert trial_queue.finish(fast_db, trial=held, score=0.5, metrics={"accuracy": 0.5}, model_file=name)
    reconcile_once(fast_db, patient, RecordingDispatcher())
    assert _trial_rows(fast_db) == 2  # its job still runs that attempt
    with fast_db.write_transaction() as tx:  # the owner stopped beating long ago
        job = tx.get(Job, tuning["job_id"])
        assert job is not None
        job.heartbeat_at = dt.datetime.now(dt.UTC) - LATER
    reconcile_once(fast_db, patient, RecordingDispatcher())  # requeued: attempt 1 is over
    assert _trial_rows(fast_db) == 0 and _trial_files(fast_settings) == []
