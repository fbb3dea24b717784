"""Who may do what with a dataset or a job: the two per-dataset roles and the lookups every
v1 router uses.

Roles on a dataset: its ``owner`` (the tenant that uploaded it) and ``analyst`` tenants the owner
invited and that accepted (until the grant is revoked). A pending or declined invitation is no
role at all: the dataset stays out of the tenant's listings and answers it 404 (kernel/access/grants.py).
What each role may do is one table per object kind below, not branches in the routers, so the
rules can be read (and tested) in one place.

Two kinds of refusal, on purpose (domain errors, kernel/errors.py; the API answers them as problems):
- 404 ``not-found`` when the caller has no role on the object: answered exactly like an id that
  does not exist, so nobody learns that another tenant's dataset or job exists.
- 403 ``forbidden`` when the caller can see the object but lacks the permission (an analyst
  asking for the ledger); telling it that the object exists reveals nothing new.

A revoked analyst has no role on the dataset any more (404 there), but keeps read access to the
jobs it submitted (their results were released to it already). Deleting a dataset revokes every
grant (kernel/datasets/deletion.py): its analysts become revoked analysts, and its owner keeps the
tombstone (its public facts, budget, ledger and jobs). What needs the rows themselves (submitting
a job) also needs the dataset to be active: 409 ``dataset-deleted`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, Select, and_, exists, or_, select
from sqlalchemy.orm import Session

from kernel.datasets.status import require_active
from kernel.db.orm import Dataset, DatasetGrant, Job, Tenant
from kernel.errors import forbidden, not_found

Role = Literal["owner", "analyst"]
DatasetNeed = Literal["read", "submit", "own", "delete"]
JobNeed = Literal["read", "cancel"]
JobRelation = Literal["dataset-owner", "submitter", "former-analyst"]
"""How a caller relates to a job: it owns the job's dataset; it submitted the job and may still
use the dataset; it submitted the job but its grant has since been revoked."""

DATASET_PERMISSIONS: Mapping[DatasetNeed, frozenset[Role]] = {
    "read": frozenset({"owner", "analyst"}),  # public facts (n, d, classes, ...) and the budget
    "submit": frozenset({"owner", "analyst"}),  # estimate and submit jobs
    "own": frozenset({"owner"}),  # the ledger, raising the budget, grants
    "delete": frozenset({"owner"}),  # erase the rows (and, at its choice, the models); the ledger stays
}
NEEDS_ACTIVE: frozenset[DatasetNeed] = frozenset({"submit"})
"""Needs that use the rows: refused (409) once a deletion has been asked for."""

JOB_PERMISSIONS: Mapping[JobNeed, frozenset[JobRelation]] = {
    # the job, its events, model and report
    "read": frozenset({"dataset-owner", "submitter", "former-analyst"}),
    # the owner may stop any job on its data (after a revoke, the only one who can)
    "cancel": frozenset({"dataset-owner", "submitter"}),
}


@dataclass(frozen=True)
class DatasetAccess:
    dataset: Dataset
    role: Role


def _active_grant_of(tenant_id: str) -> ColumnElement[bool]:
    """SQL filter: grants that make ``tenant_id`` an analyst. It accepted the invitation itself
    (``grantee_tenant_id`` is set on acceptance only), and the owner has not revoked it since."""
    return and_(
        DatasetGrant.grantee_tenant_id == tenant_id,
        DatasetGrant.accepted_at.is_not(None),
        DatasetGrant.revoked_at.is_(None),
        DatasetGrant.declined_at.is_(None),
    )


def active_grant_datasets(tenant_id: str) -> Select[str]:
    """Ids of the datasets a tenant holds an accepted, unrevoked grant on."""
    return select(DatasetGrant.dataset_id).where(_active_grant_of(tenant_id))


def owned_datasets(tenant_id: str) -> Select[str]:
    return select(Dataset.id).where(Dataset.tenant_id == tenant_id)


def visible_datasets(tenant: Tenant) -> ColumnElement[bool]:
    """SQL filter: the datasets a tenant has a role on (owned, or granted, accepted and not revoked)."""
    return or_(Dataset.tenant_id == tenant.id, Dataset.id.in_(active_grant_datasets(tenant.id)))


def visible_jobs(tenant: Tenant) -> ColumnElement[bool]:
    """SQL filter: the jobs a tenant may read (its own, and every job on a dataset it owns)."""
    return or_(Job.tenant_id == tenant.id, Job.dataset_id.in_(owned_datasets(tenant.id)))


def has_active_grant(session: Session, *, dataset_id: str, tenant_id: str) -> bool:
    return bool(
        session.scalar(select(exists().where(DatasetGrant.dataset_id == dataset_id, _active_grant_of(tenant_id))))
    )


def role_on(session: Session, tenant: Tenant, dataset: Dataset) -> Role | None:
    if dataset.tenant_id == tenant.id:
        return "owner"
    if has_active_grant(session, dataset_id=dataset.id, tenant_id=tenant.id):
        return "analyst"
    return None


def dataset_access(session: Session, tenant: Tenant, dataset_id: str, *, need: DatasetNeed = "read") -> DatasetAccess:
    """The dataset and the caller's role; 404 without a role, 403 if the role lacks ``need``."""
    dataset = session.get(Dataset, dataset_id)
    role = role_on(session, tenant, dataset) if dataset is not None else None
    if dataset is None or role is None:
        raise not_found("dataset")
    if role not in DATASET_PERMISSIONS[need]:
        raise forbidden(f"only the dataset's owner may do this (your role: {role})")
    if need in NEEDS_ACTIVE:
        require_active(dataset)
    return DatasetAccess(dataset=dataset, role=role)


def dataset_for(session: Session, tenant: Tenant, dataset_id: str, *, need: DatasetNeed = "read") -> Dataset:
    return dataset_access(session, tenant, dataset_id, need=need).dataset


def relation_to(session: Session, tenant: Tenant, job: Job) -> JobRelation | None:
    dataset = session.get(Dataset, job.dataset_id)
    if dataset is not None and dataset.tenant_id == tenant.id:
        return "dataset-owner"
    if job.tenant_id != tenant.id:
        return None
    if has_active_grant(session, dataset_id=job.dataset_id, tenant_id=tenant.id):
        return "submitter"
    return "former-analyst"


def job_for(session: Session, tenant: Tenant, job_id: str, *, need: JobNeed = "read") -> Job:
    """The job; 404 if the caller may not know it exists, 403 if it may see it but not ``need``."""
    job = session.get(Job, job_id)
    relation = relation_to(session, tenant, job) if job is not None else None
    if job is None or relation is None:
        raise not_found("job")
    if relation not in JOB_PERMISSIONS[need]:
        raise forbidden(f"you can see this job but may not {need} it (you are its {relation})")
    return job
