"""A running tuning's slots and trial queue (kernel/tuning/slots.py, kernel/tuning/trial_queue.py):
opening writes K trials and exactly ``maximum`` slots at once, each slot is claimed by one worker,
each trial taken by one slot, only a holder records a result, the last slot to finish is told so
exactly once, and a cancelled or ended tuning stops every slot."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import delete, func, select

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import TuningSlot, TuningTrial
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.slots import ClaimedSlot
from kernel.tuning.trial_queue import TakenTrial
from tests.conftest import upload
from tests.tuning_run import tuning_request
from worker.runner import JobRunner


@pytest.fixture
def running_job(alice: TestClient, digits_csv: bytes, settings: Settings, database: Database) -> str:
    """A tuning's job, claimed by a worker (attempt 1 running) but not opened."""
    dataset_id = str(upload(alice, digits_csv).json()["id"])  # type: ignore[attr-defined]
    job_id = str(alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()["job_id"])
    assert JobRunner(settings, db=database).claim(job_id) is not None
    return job_id


def _count(database: Database, table: Any) -> int:
    with database.read_session() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def test_opening_writes_the_trials_and_every_slot_once(running_job: str, database: Database) -> None:
    assert tuning_slots.open_tuning(database, job_id=running_job, attempt=1, candidates=[4, 0], slots=3)
    assert not tuning_slots.open_tuning(database, job_id=running_job, attempt=1, candidates=[1], slots=3)
    assert not tuning_slots.open_tuning(database, job_id=running_job, attempt=2, candidates=[1], slots=3)
    assert (_count(database, TuningTrial), _count(database, TuningSlot)) == (2, 3)
    with pytest.raises(ValueError, match="more trials than it has slots"):
        tuning_slots.open_tuning(database, job_id=running_job, attempt=1, candidates=[0] * 4, slots=3)


def test_a_slot_is_claimed_once_and_the_last_one_to_finish_is_told(running_job: str, database: Database) -> None:
    tuning_slots.open_tuning(database, job_id=running_job, attempt=1, candidates=[4], slots=2)
    first = tuning_slots.claim(database, job_id=running_job, attempt=1, slot=0, worker="a")
    assert first is not None
    assert tuning_slots.claim(database, job_id=running_job, attempt=1, slot=0, worker="b") is None  # a duplicate
    assert tuning_slots.claim(database, job_id=running_job, attempt=1, slot=7, worker="b") is None  # no such slot
    second = tuning_slots.claim(database, job_id=running_job, attempt=1, slot=1, worker="b")
    assert second is not None
    taken = trial_queue.take(database, job_id=running_job, attempt=1, worker="a")
    assert taken is not None and (taken.seq, taken.candidate) == (0, 4)
    assert trial_queue.take(database, job_id=running_job, attempt=1, worker="b") is None
    assert not tuning_slots.heartbeat(database, slot=first)
    assert not tuning_slots.finish(database, slot=second, outcome="ok")  # one slot still runs
    assert trial_queue.finish(
        database, trial=taken, score=0.5, metrics={"accuracy": 0.5}, model_file=None, device="cpu"
    )
    assert tuning_slots.finish(database, slot=first, outcome="ok")  # the last one
    assert not tuning_slots.finish(database, slot=first, outcome="ok")  # no longer held
    with database.read_session() as session:
        assert tuning_slots.outcomes(session, job_id=running_job, attempt=1) == ["ok", "ok"]


def test_a_cancel_stops_every_slot_and_trial(running_job: str, database: Database, alice: TestClient) -> None:
    tuning_slots.open_tuning(database, job_id=running_job, attempt=1, candidates=[0, 1], slots=3)
    held = tuning_slots.claim(database, job_id=running_job, attempt=1, slot=0, worker="a")
    taken = trial_queue.take(database, job_id=running_job, attempt=1, worker="a")
    assert held is not None and taken is not None
    tuning = alice.get("/v1/tuning-jobs").json()["items"][0]
    assert alice.post(f"/v1/tuning-jobs/{tuning['id']}/cancel").json()["status"] == "cancelled"
    assert tuning_slots.heartbeat(database, slot=held)  # told to stop
    assert tuning_slots.claim(database, job_id=running_job, attempt=1, slot=1, worker="b") is None
    assert trial_queue.take(database, job_id=running_job, attempt=1, worker="b") is None
    assert not trial_queue.finish(database, trial=taken, score=1.0, metrics={}, model_file="f", device="cpu")
    assert not trial_queue.lapse(database, trial=taken)
    assert tuning_slots.drop_abandoned(database) == 3  # the running one and the two queued
    with database.read_session() as session:
        assert tuning_slots.waiting(session) == []


class SlotsMachine(RuleBasedStateMachine):
    """Any interleaving of three workers claiming slots, taking trials, recording results and
    finishing slots: a slot and a trial are each held by one worker at most, a result is recorded
    by its holder only, "all done" is answered exactly once, and then every trial has ended."""

    database: Database
    job_id: str

    def __init__(self) -> None:
        super().__init__()
        with self.database.write_transaction() as tx:
            tx.execute(delete(TuningSlot).where(TuningSlot.job_id == self.job_id))
        trial_queue.clear(self.database, job_id=self.job_id)
        self.trials, self.slots = 3, 4
        assert tuning_slots.open_tuning(
            self.database, job_id=self.job_id, attempt=1, candidates=list(range(self.trials)), slots=self.slots
        )
        self.slot_of: dict[str, ClaimedSlot] = {}
        self.trial_of: dict[str, TakenTrial] = {}
        self.tried: set[str] = set()  # workers whose slot looked for a trial (every slot does, once)
        self.claimed: set[int] = set()
        self.ended: dict[int, str] = {}
        self.done_slots = 0
        self.told_last = 0

    @rule(worker=st.sampled_from(["a", "b", "c"]))
    def claim_next(self, worker: str) -> None:
        """A worker takes the next slot message (fair dispatch sends them in order)."""
        if worker in self.slot_of or len(self.claimed) == self.slots:
            return
        slot = min(set(range(self.slots)) - self.claimed)
        held = tuning_slots.claim(self.database, job_id=self.job_id, attempt=1, slot=slot, worker=worker)
        assert held is not None
        self.claimed.add(slot)
        self.slot_of[worker] = held

    @rule(worker=st.sampled_from(["a", "b", "c", "d"]), slot=st.integers(0, 4))
    def duplicate_claim(self, worker: str, slot: int) -> None:
        """A re-sent message for a slot that was claimed already is a no-op."""
        if slot in self.claimed:
            assert tuning_slots.claim(self.database, job_id=self.job_id, attempt=1, slot=slot, worker=worker) is None

    @rule(worker=st.sampled_from(["a", "b", "c"]))
    def take(self, worker: str) -> None:
        if worker not in self.slot_of or worker in self.tried:
            return
        self.tried.add(worker)
        taken = trial_queue.take(self.database, job_id=self.job_id, attempt=1, worker=worker)
        if taken is not None:
            assert all(other.seq != taken.seq for other in self.trial_of.values()) and taken.seq not in self.ended
            self.trial_of[worker] = taken

    @rule(worker=st.sampled_from(["a", "b", "c"]), lapsed=st.booleans(), score=st.floats(0, 1))
    def record(self, worker: str, lapsed: bool, score: float) -> None:
        taken = self.trial_of.pop(worker, None)
        if taken is None:
            return
        if lapsed:
            assert trial_queue.lapse(self.database, trial=taken)
        else:
            assert trial_queue.finish(
                self.database, trial=taken, score=score, metrics={"accuracy": score}, model_file=None, device="cpu"
            )
        self.ended[taken.seq] = "lapsed" if lapsed else "done"
        assert not trial_queue.lapse(self.database, trial=taken)  # recorded once

    @rule(worker=st.sampled_from(["a", "b", "c"]))
    def finish_slot(self, worker: str) -> None:
        if worker not in self.slot_of or worker not in self.tried or worker in self.trial_of:
            return
        self.tried.discard(worker)
        held = self.slot_of.pop(worker)
        self.done_slots += 1
        self.told_last += tuning_slots.finish(self.database, slot=held, outcome="ok")

    @invariant()
    def consistent(self) -> None:
        counts = trial_queue.counts(self.database, job_id=self.job_id, attempt=1)
        assert counts.running == len(self.trial_of)
        assert counts.done + counts.lapsed == len(self.ended) and counts.drawn == self.trials
        assert self.told_last == (1 if self.done_slots == self.slots else 0)
        if self.done_slots == self.slots:  # every slot looked for a trial: none is left
            assert counts.pending == counts.running == 0


def test_slots_and_trials_under_any_interleaving(running_job: str, database: Database) -> None:
    SlotsMachine.database = database
    SlotsMachine.job_id = running_job
    machine: Any = SlotsMachine.TestCase
    machine.settings = hypothesis_settings(
        max_examples=30, stateful_step_count=60, deadline=None, suppress_health_check=list(HealthCheck)
    )
    machine().runTest()
