"""A tuning in its public slots (kernel/tuning/slots.py), as an analyst and the workers see it.

The acceptance test of the trial count's secrecy: two tunings, one that drew K = 1 and one that
drew its maximum, give the same observable view (status and its times, events, ledger entries,
tuning view, report apart from the released trial's metric and model, every slot's duration and
every slot task's answer). Also: slots reach workers through fair dispatch like jobs, the
reconciler fails a tuning whose slot was lost, closes one whose closer was lost and re-sends lost
slot messages, a slot that overruns its margin fails its tuning, and trial files carry no count."""

from __future__ import annotations

import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from kernel.config import Settings
from kernel.db.engine import Database
from kernel.db.orm import Job, LedgerEntry, TuningSlot, TuningTrial
from kernel.ledger.audit import verify_ledger
from kernel.reconciler import reconcile_once
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.trial_files import TrialFiles
from tests.conftest import RecordingDispatcher, dp_sgd_spec, new_key, upload
from tests.tuning_run import TRIAL_TIME_LIMIT_S, run_slots, run_tuning, slots_of, tuning_request, tuning_settings
from worker.runner import JobRunner
from worker.slot_runner import SlotRunner

LATER = dt.timedelta(hours=1)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return tuning_settings(tmp_path / "data")


@pytest.fixture
def dataset_id(alice: TestClient, digits_csv: bytes) -> str:
    return str(upload(alice, digits_csv).json()["id"])  # type: ignore[attr-defined]


def _rows(database: Database, table: Any) -> int:
    with database.read_session() as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def _trial_files(settings: Settings) -> list[Path]:
    return sorted(settings.checkpoint_dir.glob("*.trial-*")) if settings.checkpoint_dir.exists() else []


def _utc(value: str | dt.datetime) -> dt.datetime:
    moment = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _seconds(later: str | dt.datetime, earlier: str | dt.datetime) -> float:
    return (_utc(later) - _utc(earlier)).total_seconds()


def _observed(client: TestClient, database: Database, tuning_id: str) -> dict[str, Any]:
    """Everything an analyst (and a bystander watching the workers) can observe of a tuning, with
    times made relative to its start and the released trial's own values set aside."""
    view = client.get(f"/v1/tuning-jobs/{tuning_id}").json()
    assert view["status"] == "succeeded", view  # else a slot overran (a very busy machine?)
    job_id = view["job_id"]
    job = client.get(f"/v1/jobs/{job_id}").json()
    started = job["started_at"]
    events = client.get(f"/v1/jobs/{job_id}/events").json()
    report = client.get(f"/v1/jobs/{job_id}/report").json()
    with database.read_session() as session:
        ledger = session.execute(
            select(LedgerEntry.kind, LedgerEntry.curve, LedgerEntry.created_at)
            .where(LedgerEntry.job_id == job_id)
            .order_by(LedgerEntry.seq)
        ).all()
        slots = session.execute(
            select(TuningSlot.started_at, TuningSlot.finished_at, TuningSlot.outcome)
            .where(TuningSlot.job_id == job_id)
            .order_by(TuningSlot.slot)
        ).all()
    for key in ("id", "job_id", "best_job_id", "created_at", "links", "selected_metric", "dataset_id"):
        view.pop(key)
    for key in ("metrics", "model_sha256", "report", "model"):
        report.pop(key, None)
    report.pop("tuning")  # its selected metric; the rest is checked through the view
    return {
        "status": view["status"],
        "view": view,
        "duration": _seconds(job["finished_at"], started),
        "events": [(e["kind"], e["payload"], _seconds(e["created_at"], started)) for e in events],
        "ledger": [(kind, curve, _seconds(created_at, started)) for kind, curve, created_at in ledger],
        "slot_seconds": [_seconds(finished, begun) for begun, finished, _ in slots],
        "slot_outcomes": [outcome for _, _, outcome in slots],
        "report_keys": sorted(report),
        "guarantee": report["guarantee"],
        "execution": report["execution"],
        "caveats": report["caveats"],
    }


def test_a_tunings_observable_view_is_the_same_whatever_its_number_of_trials(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """K = 1 and K = maximum (3), run side by side: every time, event, entry, field and slot an
    analyst or a bystander can observe is the same, but for the released trial's metric and model."""
    tunings = [alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json() for _ in range(2)]
    for tuning, count in zip(tunings, (1, 3), strict=True):
        with (
            mock.patch("kernel.privacy.sample_trial_count", return_value=count),
            mock.patch("worker.tuning.TuningClaim.draw_candidate", return_value=0),  # the same trial released
        ):
            assert JobRunner(settings, db=database).run(tuning["job_id"]) == "opened"
    answers: dict[str, dict[int, str]] = {}
    trained: list[str] = []
    real = SlotRunner._run_trial

    def slow_trial(self: SlotRunner, claimed: Any, *args: Any, **kwargs: Any) -> Any:
        """Each trial takes 1 s more: a view that followed K would differ by seconds."""
        trained.append(claimed.job.id)
        time.sleep(1.0)
        return real(self, claimed, *args, **kwargs)

    threads = [
        threading.Thread(target=lambda t=t: answers.__setitem__(t["id"], run_slots(settings, database, t["job_id"])))
        for t in tunings
    ]
    with mock.patch("worker.slot_runner.SlotRunner._run_trial", slow_trial):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    assert sorted(trained) == sorted([tunings[0]["job_id"]] + [tunings[1]["job_id"]] * 3)
    one, most = (_observed(alice, database, t["id"]) for t in tunings)
    assert one["status"] == most["status"] == "succeeded"
    assert sorted(answers[tunings[0]["id"]].values()) == sorted(answers[tunings[1]["id"]].values())
    slot_seconds = settings.tuning_slot_margin_s + TRIAL_TIME_LIMIT_S
    for seen in (one, most):
        assert all(slot_seconds <= s < slot_seconds + 0.75 for s in seen["slot_seconds"]), seen["slot_seconds"]
        assert seen["slot_outcomes"] == ["ok", "ok", "ok"]
    assert abs(one["duration"] - most["duration"]) < 1.0  # the trials alone would differ by 2 s
    for key in ("view", "report_keys", "guarantee", "execution", "caveats", "slot_outcomes"):
        assert one[key] == most[key], key
    assert [e[:2] for e in one["events"]] == [e[:2] for e in most["events"]]
    assert all(abs(a[2] - b[2]) < 1.0 for a, b in zip(one["events"], most["events"], strict=True))
    assert [e[:2] for e in one["ledger"]] == [e[:2] for e in most["ledger"]]
    assert all(abs(a[2] - b[2]) < 1.0 for a, b in zip(one["ledger"], most["ledger"], strict=True))
    assert _rows(database, TuningTrial) == 0 and _trial_files(settings) == []
    assert verify_ledger(database, dataset_id=dataset_id).ok


def test_slots_reach_the_workers_through_fair_dispatch_like_jobs(
    alice: TestClient,
    app_client: TestClient,
    dataset_id: str,
    settings: Settings,
    database: Database,
    dispatcher: RecordingDispatcher,
) -> None:
    """A tuning is not one job: its slots are sent a few at a time (its tenant's share and its own
    cap), and another tenant's job is sent at once beside them."""
    request = tuning_request(dataset_id, distribution="poisson", mean=6, maximum=12)
    tuning = alice.post("/v1/tuning-jobs", json=request).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=2):
        assert JobRunner(settings, db=database, dispatcher=dispatcher).run(tuning["job_id"]) == "opened"
    assert len(dispatcher.slots) == settings.dispatch_per_tenant == 4  # of 12, whatever K is
    bob = {"Authorization": f"Bearer {new_key(database, 'bob')}"}
    query = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    bob_dataset = app_client.post("/v1/datasets", params=query, content=_digits(), headers=bob).json()["id"]
    job = app_client.post("/v1/jobs", json=dp_sgd_spec(bob_dataset), headers=bob).json()
    assert dispatcher.sent[-1] == job["id"]  # not behind the tuning's other 8 slots
    held = tuning_slots.claim(database, job_id=tuning["job_id"], attempt=1, slot=0, worker="w")
    assert held is not None
    runner = JobRunner(settings, db=database, dispatcher=dispatcher)
    runner._send_next()
    assert [slot for _, _, slot in dispatcher.slots] == [0, 1, 2, 3]  # the running one counts against its cap
    tuning_slots.finish(database, slot=held, outcome="ok")
    runner._send_next()
    assert [slot for _, _, slot in dispatcher.slots] == [0, 1, 2, 3, 4]  # one more once a slot ended


def _digits() -> bytes:
    from tests.conftest import digits_split, to_csv

    X, _, y, _ = digits_split()
    return to_csv(X, y)


def test_a_lost_slot_fails_the_tuning_and_leaves_nothing(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """A slot whose worker stopped beating cannot keep its length: the tuning fails at once with
    its whole charge, its trials and their files are deleted, and its other slots never run."""
    tuning = alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()
    job_id = tuning["job_id"]
    with mock.patch("kernel.privacy.sample_trial_count", return_value=2):
        assert JobRunner(settings, db=database).run(job_id) == "opened"
    held = tuning_slots.claim(database, job_id=job_id, attempt=1, slot=0, worker="lost")
    taken = trial_queue.take(database, job_id=job_id, attempt=1, worker="lost")
    assert held is not None and taken is not None
    name = TrialFiles.name(taken)
    settings.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (settings.checkpoint_dir / name).write_bytes(b"a trial's model")
    assert trial_queue.finish(
        database, trial=taken, score=0.5, metrics={"accuracy": 0.5}, model_file=name, device="cpu"
    )
    patient = settings.model_copy(update={"stale_after_s": LATER.total_seconds() / 2})
    reconcile_once(database, patient, RecordingDispatcher())
    assert alice.get(f"/v1/tuning-jobs/{tuning['id']}").json()["status"] == "running"  # still beating
    with database.write_transaction() as tx:
        tx.execute(
            update(TuningSlot).where(TuningSlot.id == held.id).values(heartbeat_at=dt.datetime.now(dt.UTC) - LATER)
        )
    reconcile_once(database, patient, RecordingDispatcher())
    view = alice.get(f"/v1/tuning-jobs/{tuning['id']}").json()
    assert view["status"] == "failed" and view["error_code"] == "worker-lost" and view["best_job_id"] is None
    assert _rows(database, TuningTrial) == 0 and _trial_files(settings) == []
    with database.read_session() as session:
        assert tuning_slots.waiting(session) == []
    assert set(run_slots(settings, database, job_id).values()) == {"skipped"}
    with database.read_session() as session:
        kinds = session.scalars(select(LedgerEntry.kind).where(LedgerEntry.job_id == job_id).order_by(LedgerEntry.seq))
        assert list(kinds) == ["RESERVE", "TOUCH", "COMMIT"]
    assert verify_ledger(database, dataset_id=dataset_id).ok


def test_the_reconciler_closes_a_tuning_whose_closer_was_lost(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    tuning = alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()
    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=2),
        mock.patch("kernel.tuning.closing.Closer.close", return_value="lost"),  # the last slot's worker dies
    ):
        assert run_tuning(settings, database, tuning["job_id"]) == "running"
    reconcile_once(database, settings, RecordingDispatcher())
    assert alice.get(f"/v1/tuning-jobs/{tuning['id']}").json()["status"] == "running"  # not long enough ago
    patient = settings.model_copy(update={"stale_after_s": 0.01})
    time.sleep(0.05)
    reconcile_once(database, patient, RecordingDispatcher())
    view = alice.get(f"/v1/tuning-jobs/{tuning['id']}").json()
    assert view["status"] == "succeeded" and view["selected"] is not None
    assert alice.get(f"/v1/jobs/{tuning['job_id']}/model").status_code == 200
    assert alice.get(f"/v1/jobs/{tuning['job_id']}/report").json()["tuning"]["selected"] == view["selected"]
    assert _rows(database, TuningTrial) == 0 and _trial_files(settings) == []


def test_a_lost_slot_message_is_sent_again(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database, dispatcher: RecordingDispatcher
) -> None:
    tuning = alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=1):
        assert JobRunner(settings, db=database, dispatcher=dispatcher).run(tuning["job_id"]) == "opened"
    assert len(dispatcher.slots) == 3
    resend = RecordingDispatcher()
    reconcile_once(database, settings, resend)
    assert resend.slots == []  # sent moments ago
    eager = settings.model_copy(update={"redispatch_after_s": 0.01})
    time.sleep(0.05)
    reconcile_once(database, eager, resend)
    assert sorted(resend.slots) == sorted(dispatcher.slots)
    reconcile_once(database, settings, resend)
    assert len(resend.slots) == 3  # marked sent again: not re-sent every round


def test_a_slot_that_overruns_its_margin_fails_the_tuning(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """Storing a trial's model took longer than the slot's margin: the slot did not keep its
    length, so the tuning fails (its end is still published when its last slot ends)."""
    tuning = alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()
    real = SlotRunner._write_trial_model

    def slow_write(self: SlotRunner, *args: Any, **kwargs: Any) -> Any:
        time.sleep(settings.tuning_slot_margin_s + TRIAL_TIME_LIMIT_S + 0.5)
        return real(self, *args, **kwargs)

    with (
        mock.patch("kernel.privacy.sample_trial_count", return_value=1),
        mock.patch("worker.slot_runner.SlotRunner._write_trial_model", slow_write),
    ):
        assert run_tuning(settings, database, tuning["job_id"]) == "failed"
    view = alice.get(f"/v1/tuning-jobs/{tuning['id']}").json()
    assert view["error_code"] == "slot-overran" and view["best_job_id"] is None
    assert _rows(database, TuningTrial) == 0 and _trial_files(settings) == []


def test_trial_model_files_are_named_at_random() -> None:
    taken = trial_queue.TakenTrial(id=1, job_id="job_x", attempt=1, seq=0, candidate=0, worker="w", claims=1)
    names = {TrialFiles.name(taken) for _ in range(50)}
    assert len(names) == 50 and all(name.startswith("job_x.trial-") for name in names)
    assert all(len(name.removeprefix("job_x.trial-").removesuffix(".safetensors")) == 32 for name in names)


def test_slot_rows_stay_public_and_count_no_trials(
    alice: TestClient, dataset_id: str, settings: Settings, database: Database
) -> None:
    """After the tuning, its slots remain (the view counts them); its trials are gone."""
    tuning = alice.post("/v1/tuning-jobs", json=tuning_request(dataset_id)).json()
    with mock.patch("kernel.privacy.sample_trial_count", return_value=1):
        assert run_tuning(settings, database, tuning["job_id"]) == "succeeded"
    assert len(slots_of(database, tuning["job_id"])) == 3 and _rows(database, TuningTrial) == 0
    listed = alice.get("/v1/tuning-jobs").json()["items"][0]
    assert listed["schedule"]["slots_done"] == 3
    with database.read_session() as session:
        assert session.get(Job, tuning["job_id"]) is not None


class BrokerPool:
    """A FIFO broker and ``workers`` worker threads that take one message at a time (Celery with
    prefetch 1): jobs run with ``JobRunner.run``, slots with ``run_slot``; every runner sends the
    next fair pick when it takes a message, as the service's workers do."""

    def __init__(self, settings: Settings, database: Database, *, workers: int) -> None:
        import queue

        self.settings, self.database = settings, database
        self.messages: queue.Queue[tuple[str, int, int] | None] = queue.Queue()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for thread in self.threads:
            thread.start()

    def dispatch(self, job_id: str, *, queue: str | None = None) -> None:
        self.messages.put((job_id, -1, -1))

    def dispatch_slot(self, job_id: str, *, attempt: int, slot: int, queue: str | None = None) -> None:
        self.messages.put((job_id, attempt, slot))

    def _work(self) -> None:
        runner = JobRunner(self.settings, db=self.database, dispatcher=self)
        while (message := self.messages.get()) is not None:
            job_id, attempt, slot = message
            if slot < 0:
                runner.run(job_id)
            else:
                runner.run_slot(job_id, attempt=attempt, slot=slot)

    def stop(self) -> None:
        for _ in self.threads:
            self.messages.put(None)
        for thread in self.threads:
            thread.join(timeout=120)


def test_a_bystanders_job_starts_within_a_few_slots_while_tunings_fill_the_workers(
    tmp_path: Path, digits_csv: bytes
) -> None:
    """One tenant's tunings saturate two workers (3 tunings × 8 slots of 2 s: 48 s of worker time,
    24 s on two workers); another tenant's short job, submitted once they run, starts within a few
    slot lengths (two, on an idle machine): it waits behind at most the slots already in the
    broker, never behind whole tunings."""
    from api.main import create_app

    settings = tuning_settings(tmp_path / "data", dispatch_per_tenant=2, tuning_parallel_trials=2)
    database = Database(settings.resolved_database_url)
    pool = BrokerPool(settings, database, workers=2)
    try:
        with TestClient(create_app(settings, dispatcher=pool)) as client:
            alice = {"Authorization": f"Bearer {new_key(database, 'alice')}"}
            bob = {"Authorization": f"Bearer {new_key(database, 'bob')}"}
            query = {"name": "digits", "format": "csv", "label_column": "label", "epsilon": 50, "delta": 1e-5}
            alices = client.post("/v1/datasets", params=query, content=digits_csv, headers=alice).json()["id"]
            request = tuning_request(alices, distribution="poisson", mean=2, maximum=8)
            request["base"]["training"]["time_limit_s"] = 1.0
            tunings = [client.post("/v1/tuning-jobs", json=request, headers=alice).json() for _ in range(3)]
            deadline = time.monotonic() + 60
            while not all(tuning_slots_running(database, t["job_id"]) for t in tunings[:1]):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            bobs = client.post("/v1/datasets", params=query, content=digits_csv, headers=bob).json()["id"]
            spec = dp_sgd_spec(bobs)
            spec["training"] = {"steps": 2, "batch_size": 32, "learning_rate": 0.1}
            submitted = time.monotonic()
            job = client.post("/v1/jobs", json=spec, headers=bob).json()
            while client.get(f"/v1/jobs/{job['id']}", headers=bob).json()["status"] == "queued":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            waited = time.monotonic() - submitted
            slot_seconds = 1.0 + settings.tuning_slot_margin_s
            assert waited < 4 * slot_seconds + 2.0, waited  # 24 s of the tunings' work was ahead of it
            unfinished = [
                t
                for t in tunings
                if client.get(f"/v1/tuning-jobs/{t['id']}", headers=alice).json()["status"] == "running"
            ]
            assert unfinished  # the tunings were still saturating the workers
    finally:
        for tuning in tunings:
            database_cancel(database, tuning["job_id"])
        pool.stop()
        database.dispose()


def tuning_slots_running(database: Database, job_id: str) -> bool:
    with database.read_session() as session:
        return bool(
            session.scalar(
                select(func.count())
                .select_from(TuningSlot)
                .where(TuningSlot.job_id == job_id, TuningSlot.state == "running")
            )
        )


def database_cancel(database: Database, job_id: str) -> None:
    """End a tuning left running by a test, so its slots stop at their next beat."""
    from kernel.jobs import lifecycle

    with database.read_session() as session:
        job = session.get(Job, job_id)
    if job is not None and job.status in ("queued", "running"):
        lifecycle.cancel(database, job_id=job_id, dataset_id=job.dataset_id, actor="test")
