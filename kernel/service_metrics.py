"""Prometheus metrics, computed from the database at scrape time.

Why from the database and not in-process counters: jobs are created by API processes and run by
workers in other processes (or machines); the database is the one place that sees all of them,
so every API replica exports the same, complete numbers. Only public values are exported (job
counts and timings, ε committed per dataset — the same figures a dataset's budget endpoint
shows). Per-dataset gauges name every tenant's dataset ids, so they are exported only to a
scraper holding PRIVTRAIN_METRICS_TOKEN; without it /metrics is aggregate only.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from kernel.db.orm import Dataset, Job, PrivacyBudget, TuningSlot
from kernel.jobs.status import JobStatus
from kernel.ledger import operations as ledger

__all__ = ["RECENT_JOBS", "collect_metrics"]

RECENT_JOBS = 1000
"""Queue-wait and run-time quantiles are over the most recently started/finished jobs."""
QUANTILES = (0.5, 0.9, 0.99)


def _utc(value: dt.datetime) -> dt.datetime:
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _seconds(pairs: Sequence[tuple[dt.datetime | None, dt.datetime | None]]) -> list[float]:
    """Durations of the (start, end) pairs; the queries already select only rows with both set."""
    return [(_utc(end) - _utc(start)).total_seconds() for start, end in pairs if start is not None and end is not None]


def collect_metrics(session: Session, *, per_dataset: bool, now: dt.datetime | None = None) -> CollectorRegistry:
    """A fresh registry filled from the database. ``per_dataset`` adds ε gauges labelled by
    dataset id: those name every tenant's datasets, so only an authenticated scraper gets them."""
    now = now or dt.datetime.now(dt.UTC)
    registry = CollectorRegistry()

    jobs = Gauge("privtrain_jobs", "Jobs by status", ["status"], registry=registry)
    counts = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    for status in JobStatus:
        jobs.labels(status=status).set(counts.get(status, 0))

    waits = _seconds(
        session.execute(
            select(Job.created_at, Job.started_at)
            .where(Job.started_at.is_not(None))
            .order_by(Job.started_at.desc())
            .limit(RECENT_JOBS)
        ).all()
    )
    runs = _seconds(
        session.execute(
            select(Job.started_at, Job.finished_at)
            .where(Job.started_at.is_not(None), Job.finished_at.is_not(None))
            .order_by(Job.finished_at.desc())
            .limit(RECENT_JOBS)
        ).all()
    )
    wait_gauge = Gauge(
        "privtrain_job_queue_wait_seconds",
        f"Submission to start, over the last {RECENT_JOBS} started jobs",
        ["quantile"],
        registry=registry,
    )
    run_gauge = Gauge(
        "privtrain_job_run_seconds",
        f"Start to finish, over the last {RECENT_JOBS} finished jobs",
        ["quantile"],
        registry=registry,
    )
    for q in QUANTILES:
        wait_gauge.labels(quantile=str(q)).set(_quantile(waits, q))
        run_gauge.labels(quantile=str(q)).set(_quantile(runs, q))

    # An opened tuning's job has no heartbeat of its own: its running slots beat instead.
    opened = exists().where(TuningSlot.job_id == Job.id, TuningSlot.attempt == Job.attempt)
    beats = [
        *session.scalars(
            select(Job.heartbeat_at).where(Job.status == JobStatus.RUNNING, Job.heartbeat_at.is_not(None), ~opened)
        ),
        *session.scalars(
            select(TuningSlot.heartbeat_at).where(TuningSlot.state == "running", TuningSlot.heartbeat_at.is_not(None))
        ),
    ]
    heartbeats = [(now - _utc(beat)).total_seconds() for beat in beats if beat is not None]
    Gauge(
        "privtrain_worker_heartbeat_age_max_seconds",
        "Oldest heartbeat among running jobs (0 when none run)",
        registry=registry,
    ).set(max(heartbeats, default=0.0))
    Gauge(
        "privtrain_running_jobs_with_heartbeat", "Running jobs that have reported a heartbeat", registry=registry
    ).set(len(heartbeats))

    if not per_dataset:
        return registry
    committed = Gauge(
        "privtrain_epsilon_committed", "ε committed on a dataset's ledger (at its δ)", ["dataset_id"], registry=registry
    )
    reserved = Gauge(
        "privtrain_epsilon_reserved", "ε reserved by queued/running jobs", ["dataset_id"], registry=registry
    )
    public = select(Dataset.id).where(Dataset.public.is_(True))  # their budget row is only a lock
    for budget in session.scalars(select(PrivacyBudget).where(PrivacyBudget.dataset_id.not_in(public))):
        summary = ledger.budget_summary(budget)
        committed.labels(dataset_id=budget.dataset_id).set(summary["committed_epsilon"])
        reserved.labels(dataset_id=budget.dataset_id).set(summary["reserved_epsilon"])
    return registry
