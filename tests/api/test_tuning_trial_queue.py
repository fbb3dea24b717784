"""The trial queue a tuning's workers share (app/tuning/trial_queue.py): each trial is held by one
worker at a time, only its holder beats for it or finishes it, a trial whose worker vanished runs
again until it was taken ``max_attempts`` times, and nothing of a settled tuning stays behind."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import func, select, update

from app.config import Settings
from app.db import Database
from app.jobs import lifecycle
from app.models import Job, TuningTrial
from app.tuning import trial_queue
from app.tuning.trial_queue import TakenTrial, TrialsLost
from tests.api.test_api_tuning import _request
from tests.conftest import upload
from worker.runner import JobRunner

LATER = dt.timedelta(hours=1)


@pytest.fixture
def running_job(alice: TestClient, digits_csv: bytes, settings: Settings, database: Database) -> str:
    """A tuning's job, claimed by its worker (attempt 1 running)."""
    dataset_id = str(upload(alice, digits_csv).json()["id"])  # type: ignore[attr-defined]
    job_id = str(alice.post("/v1/tuning-jobs", json=_request(dataset_id)).json()["job_id"])
    assert JobRunner(settings, db=database).claim(job_id) is not None
    return job_id


def _rows(database: Database) -> int:
    with database.read_session() as session:
        return int(session.scalar(select(func.count()).select_from(TuningTrial)) or 0)


def _now_later() -> dt.datetime:
    return dt.datetime.now(dt.UTC) + LATER


def test_trials_are_taken_in_the_order_drawn_each_by_one_worker(running_job: str, database: Database) -> None:
    trial_queue.enqueue(database, job_id=running_job, attempt=1, candidates=[4, 0, 4])
    first = trial_queue.take(database, job_id=running_job, attempt=1, worker="a")
    second = trial_queue.take(database, job_id=running_job, attempt=1, worker="b")
    third = trial_queue.take(database, job_id=running_job, attempt=1, worker="a")
    assert first is not None and second is not None and third is not None
    assert [(t.seq, t.candidate, t.worker) for t in (first, second, third)] == [(0, 4, "a"), (1, 0, "b"), (2, 4, "a")]
    assert trial_queue.take(database, job_id=running_job, attempt=1, worker="c") is None
    assert trial_queue.take(database, job_id=running_job, attempt=2, worker="c") is None  # not the running attempt
    assert trial_queue.counts(database, job_id=running_job, attempt=1) == trial_queue.TrialCounts(0, 3, 0)


def test_only_the_holder_finishes_a_trial_and_a_stale_one_runs_again(running_job: str, database: Database) -> None:
    trial_queue.enqueue(database, job_id=running_job, attempt=1, candidates=[1])
    lost = trial_queue.take(database, job_id=running_job, attempt=1, worker="lost")
    assert lost is not None
    assert (
        trial_queue.requeue_stale(database, job_id=running_job, attempt=1, stale_before=_now_later(), max_takes=3) == 1
    )
    assert trial_queue.heartbeat(database, trial=lost)  # no longer its trial: stop
    retaken = trial_queue.take(database, job_id=running_job, attempt=1, worker="lost")  # same worker name, new take
    assert retaken is not None and retaken.claims == 2
    assert not trial_queue.finish(database, trial=lost, score=1.0, metrics={"accuracy": 1.0}, model_file="x")
    assert not trial_queue.heartbeat(database, trial=retaken)
    assert trial_queue.finish(database, trial=retaken, score=0.5, metrics={"accuracy": 0.5}, model_file=None)
    [done] = trial_queue.finished(database, job_id=running_job, attempt=1)
    assert (done.seq, done.score, done.metrics, done.model_file) == (0, 0.5, {"accuracy": 0.5}, None)


def test_a_trial_lost_on_every_take_fails_the_tuning(running_job: str, database: Database) -> None:
    trial_queue.enqueue(database, job_id=running_job, attempt=1, candidates=[0])
    for _ in range(2):
        assert trial_queue.take(database, job_id=running_job, attempt=1, worker="w") is not None
        trial_queue.requeue_stale(database, job_id=running_job, attempt=1, stale_before=_now_later(), max_takes=3)
    assert trial_queue.take(database, job_id=running_job, attempt=1, worker="w") is not None
    with pytest.raises(TrialsLost):
        trial_queue.requeue_stale(database, job_id=running_job, attempt=1, stale_before=_now_later(), max_takes=3)


def test_a_fresh_heartbeat_keeps_a_trial(running_job: str, database: Database) -> None:
    trial_queue.enqueue(database, job_id=running_job, attempt=1, candidates=[0])
    held = trial_queue.take(database, job_id=running_job, attempt=1, worker="w")
    assert held is not None and not trial_queue.heartbeat(database, trial=held)
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=60)
    assert trial_queue.requeue_stale(database, job_id=running_job, attempt=1, stale_before=recent, max_takes=3) == 0


def test_a_cancel_or_a_new_attempt_stops_the_trials(running_job: str, database: Database, alice: TestClient) -> None:
    trial_queue.enqueue(database, job_id=running_job, attempt=1, candidates=[0, 1])
    held = trial_queue.take(database, job_id=running_job, attempt=1, worker="w")
    assert held is not None and not trial_queue.heartbeat(database, trial=held)
    with database.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == running_job).values(cancel_requested=True))
    assert trial_queue.heartbeat(database, trial=held)
    assert trial_queue.take(database, job_id=running_job, attempt=1, worker="w") is None


def test_clearing_keeps_the_running_attempt_and_names_every_kept_model(running_job: str, database: Database) -> None:
    for attempt in (0, 1):
        trial_queue.enqueue(database, job_id=running_job, attempt=attempt, candidates=[0, 1])
    with database.write_transaction() as tx:
        tx.execute(update(TuningTrial).where(TuningTrial.seq == 1).values(model_file=TuningTrial.job_id + "-file"))
    assert trial_queue.clear_abandoned(database) == [f"{running_job}-file"]  # attempt 0's: its job runs attempt 1
    assert _rows(database) == 2
    assert trial_queue.clear(database, job_id=running_job, keep_attempt=1) == []
    assert _rows(database) == 2
    with database.read_session() as session:
        dataset_id = session.scalar(select(Job.dataset_id).where(Job.id == running_job))
    assert dataset_id is not None
    failed = lifecycle.requeue_or_fail(
        database, job_id=running_job, dataset_id=dataset_id, attempt=1, stale_before=_now_later(), max_attempts=1
    )  # the worker was lost on its last attempt
    assert failed == "failed"
    assert trial_queue.clear_abandoned(database) == [f"{running_job}-file"]
    assert _rows(database) == 0


class TrialQueueMachine(RuleBasedStateMachine):
    """Any interleaving of takes, beats, finishes and stale requeues by three workers: a trial is
    never held by two workers at once, a finished trial's result is its last holder's, and once
    nothing is pending or running every trial is finished exactly once."""

    database: Database
    job_id: str

    def __init__(self) -> None:
        super().__init__()
        trial_queue.clear(self.database, job_id=self.job_id)
        self.trials = 5
        trial_queue.enqueue(self.database, job_id=self.job_id, attempt=1, candidates=list(range(self.trials)))
        self.held: dict[str, TakenTrial] = {}
        self.finished: dict[int, float] = {}

    @rule(worker=st.sampled_from(["a", "b", "c"]))
    def take(self, worker: str) -> None:
        if worker in self.held:
            return
        taken = trial_queue.take(self.database, job_id=self.job_id, attempt=1, worker=worker)
        if taken is not None:
            assert all(other.seq != taken.seq for other in self.held.values())
            self.held[worker] = taken

    @rule(worker=st.sampled_from(["a", "b", "c"]), score=st.floats(0, 1))
    def finish(self, worker: str, score: float) -> None:
        taken = self.held.pop(worker, None)
        if taken is None:
            return
        assert not trial_queue.heartbeat(self.database, trial=taken)  # still its trial
        assert trial_queue.finish(self.database, trial=taken, score=score, metrics={"accuracy": score}, model_file=None)
        assert taken.seq not in self.finished
        self.finished[taken.seq] = score
        assert not trial_queue.finish(self.database, trial=taken, score=0.0, metrics={}, model_file=None)

    @precondition(lambda self: bool(self.held))
    @rule()
    def all_held_go_stale(self) -> None:
        requeued = trial_queue.requeue_stale(
            self.database, job_id=self.job_id, attempt=1, stale_before=_now_later(), max_takes=1_000
        )
        assert requeued == len(self.held)
        for taken in self.held.values():
            assert trial_queue.heartbeat(self.database, trial=taken)  # it is told to stop
        self.held.clear()

    @invariant()
    def consistent(self) -> None:
        counts = trial_queue.counts(self.database, job_id=self.job_id, attempt=1)
        assert counts.running == len(self.held)
        assert counts.done == len(self.finished)
        assert counts.pending + counts.running + counts.done == self.trials
        done = {t.seq: t.score for t in trial_queue.finished(self.database, job_id=self.job_id, attempt=1)}
        assert done == self.finished


def test_the_trial_queue_under_any_interleaving(running_job: str, database: Database) -> None:
    TrialQueueMachine.database = database
    TrialQueueMachine.job_id = running_job
    machine: Any = TrialQueueMachine.TestCase
    machine.settings = hypothesis_settings(
        max_examples=25, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
    )
    machine().runTest()
