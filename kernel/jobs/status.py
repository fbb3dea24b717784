"""The statuses a job can be in and the kinds of event it records.

``StrEnum``s, so a member is the very string stored in the ``jobs.status`` and
``job_events.kind`` columns and sent in JSON: rows written before the enum read back equal to
its members. Dependency-free, so the ORM models can use it for their defaults.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["ACTIVE_STATUSES", "TERMINAL_STATUSES", "JobEventKind", "JobStatus"]


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATUSES: Final[frozenset[JobStatus]] = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
"""A job in one of these has settled its reservation and never changes again."""
ACTIVE_STATUSES: Final[frozenset[JobStatus]] = frozenset(JobStatus) - TERMINAL_STATUSES
"""Queued or running: what counts against a tenant's active-job limit."""


class JobEventKind(StrEnum):
    """The lifecycle events a job records (payloads: public values only)."""

    QUEUED = "queued"
    STARTED = "started"
    PROGRESS = "progress"
    CANCEL_REQUESTED = "cancel-requested"
    REQUEUED = "requeued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
