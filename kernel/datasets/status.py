"""A dataset's life: active, deleting (its jobs settle), deleted (a tombstone).

Dependency-free (the ORM models use it for their defaults), like kernel/jobs/status.py. The three
transitions below are the only writes of a dataset's status (a test holds every other module to
that, as it holds them to kernel.jobs.lifecycle for a job's); their callers hold the dataset's budget
lock. What each status allows is decided here and in kernel/access/roles.py; how a deletion runs is
kernel/datasets/deletion.py.
"""

from __future__ import annotations

import datetime as dt
from enum import StrEnum
from typing import Protocol

from kernel.errors import Conflict

__all__ = ["DatasetNotActive", "DatasetStatus", "begin_deletion", "mark_erased", "reactivate", "require_active"]


class DatasetStatus(StrEnum):
    ACTIVE = "active"
    DELETING = "deleting"
    """Deletion asked for: no new job, no grant; running jobs stop and settle, then the files go."""
    DELETED = "deleted"
    """A tombstone: public facts, budget, ledger and jobs kept; rows, arrays and private files erased."""


class _Deletable(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def deletion_requested_at(self) -> dt.datetime | None: ...


class _Row(Protocol):
    """The columns of ``datasets`` the transitions write."""

    status: str
    deletion_requested_at: dt.datetime | None
    deleted_at: dt.datetime | None
    delete_models: bool


class DatasetNotActive(Conflict):
    """The dataset is being deleted, or was: its rows cannot be used or shared any more."""

    def __init__(self, dataset: _Deletable) -> None:
        state = "is being deleted" if dataset.status == DatasetStatus.DELETING else "was deleted"
        super().__init__(
            slug="dataset-deleted",
            detail=f"dataset {dataset.id} {state} by its owner: no job can be submitted on it and it cannot be "
            "shared or given more budget. Its ledger is kept; uploading the same content again continues it",
            extra={"dataset_id": dataset.id, "dataset_status": str(dataset.status)},
        )


def require_active(dataset: _Deletable) -> None:
    """Refuse anything that would use or extend a dataset being deleted (409 ``dataset-deleted``)."""
    if dataset.status != DatasetStatus.ACTIVE:
        raise DatasetNotActive(dataset)


def begin_deletion(dataset: _Row, *, now: dt.datetime, delete_models: bool) -> None:
    """active → deleting; asked again, only keeping the models may turn into deleting them (and a
    tombstone whose kept models are now to go is deleting again until they are erased)."""
    if dataset.status == DatasetStatus.ACTIVE:
        dataset.status = DatasetStatus.DELETING
        dataset.deletion_requested_at = now
    if delete_models and not dataset.delete_models:
        dataset.delete_models = True
        dataset.status = DatasetStatus.DELETING


def mark_erased(dataset: _Row, *, now: dt.datetime) -> None:
    """deleting → deleted: its files are erased; it is a tombstone."""
    dataset.status = DatasetStatus.DELETED
    dataset.deleted_at = now


def reactivate(dataset: _Row) -> None:
    """deleted → active: the same rows were registered again, and its ledger continues."""
    dataset.status = DatasetStatus.ACTIVE
    dataset.deletion_requested_at = None
    dataset.deleted_at = None
    dataset.delete_models = False
