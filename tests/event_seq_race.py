"""A race on one job's event numbers, shared by the SQLite and PostgreSQL tests.

Worker threads append progress events (each in its own write transaction, as the worker's step
hook does) while the API cancels the running job, which appends ``cancel-requested``. Every event
must get its own number, and the numbers must run 1, 2, 3 … without a gap: ``seq`` comes from
one atomic ``UPDATE jobs SET event_count = event_count + 1 … RETURNING``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import select, update

from kernel.db.engine import Database
from kernel.db.orm import Job, JobEvent, utcnow
from kernel.jobs.events import add_job_event

WRITERS = 4
EVENTS_PER_WRITER = 15
JOIN_TIMEOUT_S = 120.0


def race_event_writers(db: Database, job_id: str, *, cancel: Callable[[], int]) -> None:
    """Run the race on a queued job (it is marked running first) and check the numbering.
    ``cancel`` sends the API's cancel request and returns its HTTP status."""
    with db.write_transaction() as tx:
        tx.execute(update(Job).where(Job.id == job_id).values(status="running", started_at=utcnow()))
        before = tx.scalar(select(Job.event_count).where(Job.id == job_id)) or 0
    barrier = threading.Barrier(WRITERS + 1)
    failures: list[BaseException] = []
    statuses: list[int] = []

    def worker(writer: int) -> None:
        try:
            barrier.wait(timeout=JOIN_TIMEOUT_S)
            for step in range(EVENTS_PER_WRITER):
                with db.write_transaction() as tx:
                    add_job_event(tx, job_id, "progress", {"step": step, "writer": writer})
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            failures.append(exc)

    def api_cancel() -> None:
        try:
            barrier.wait(timeout=JOIN_TIMEOUT_S)
            statuses.append(cancel())
        except Exception as exc:  # noqa: BLE001 - surfaced by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(WRITERS)]
    threads.append(threading.Thread(target=api_cancel))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=JOIN_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "a writer hung"
    assert not failures, failures
    assert statuses == [202]
    with db.read_session() as session:
        rows = list(
            session.execute(select(JobEvent.seq, JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.seq))
        )
        event_count = session.scalar(select(Job.event_count).where(Job.id == job_id))
    expected = before + WRITERS * EVENTS_PER_WRITER + 1
    assert [seq for seq, _kind in rows] == list(range(1, expected + 1)), "unique and gapless"
    assert event_count == expected
    assert [kind for _seq, kind in rows].count("cancel-requested") == 1
