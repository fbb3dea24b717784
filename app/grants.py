"""Granting and revoking analyst access to a dataset (the owner's actions).

Why the budget row is locked: a grant decides who may spend the dataset's budget, and admission
(POST /v1/jobs) re-checks the caller's access under the same row lock. So a revoke and a
submission are serialised: once the revoke has committed, no job of the revoked analyst can be
admitted, even one whose request was already in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, aliased

from app import ledger
from app.models import Dataset, DatasetGrant, Tenant, utcnow
from app.problems import Problem, not_found


@dataclass(frozen=True)
class GrantView:
    """A grant row with tenant names instead of ids (owners know tenants by name)."""

    grant: DatasetGrant
    tenant: str
    granted_by: str
    revoked_by: str | None


def _tenant_named(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise not_found("tenant")
    return tenant


def _active_grant(session: Session, *, dataset_id: str, tenant_id: str) -> DatasetGrant | None:
    return session.scalar(
        select(DatasetGrant).where(
            DatasetGrant.dataset_id == dataset_id,
            DatasetGrant.grantee_tenant_id == tenant_id,
            DatasetGrant.revoked_at.is_(None),
        )
    )


def grant_access(session: Session, *, dataset: Dataset, grantee_name: str, owner: Tenant) -> tuple[GrantView, bool]:
    """Grant ``grantee_name`` the analyst role; (the grant, whether it is new). Granting twice
    returns the active grant unchanged, so retries are safe."""
    ledger.lock_budget(session, dataset.id)
    grantee = _tenant_named(session, grantee_name)
    if grantee.id == dataset.tenant_id:
        raise Problem(status=422, slug="invalid-grant", detail="the owner of a dataset cannot be granted access to it")
    existing = _active_grant(session, dataset_id=dataset.id, tenant_id=grantee.id)
    if existing is not None:
        return _view(session, existing), False
    grant = DatasetGrant(dataset_id=dataset.id, grantee_tenant_id=grantee.id, granted_by=owner.id, granted_at=utcnow())
    session.add(grant)
    session.flush()
    return _view(session, grant), True


def revoke_access(session: Session, *, dataset: Dataset, grantee_name: str, owner: Tenant) -> GrantView:
    """End the tenant's active grant; the row stays (audit trail). 404 if there is none."""
    ledger.lock_budget(session, dataset.id)
    grantee = _tenant_named(session, grantee_name)
    grant = _active_grant(session, dataset_id=dataset.id, tenant_id=grantee.id)
    if grant is None:
        raise not_found("grant")
    grant.revoked_at = utcnow()
    grant.revoked_by = owner.id
    session.flush()
    return _view(session, grant)


def grants_of(session: Session, dataset_id: str) -> list[GrantView]:
    """Every grant of the dataset, revoked ones included, oldest first."""
    grantee, granter, revoker = aliased(Tenant), aliased(Tenant), aliased(Tenant)
    rows = session.execute(
        select(DatasetGrant, grantee.name, granter.name, revoker.name)
        .join(grantee, grantee.id == DatasetGrant.grantee_tenant_id)
        .join(granter, granter.id == DatasetGrant.granted_by)
        .outerjoin(revoker, revoker.id == DatasetGrant.revoked_by)
        .where(DatasetGrant.dataset_id == dataset_id)
        .order_by(DatasetGrant.granted_at, DatasetGrant.id)
    ).all()
    return [GrantView(grant=g, tenant=t, granted_by=by, revoked_by=rb) for g, t, by, rb in rows]


def _view(session: Session, grant: DatasetGrant) -> GrantView:
    def name(tenant_id: str | None) -> str | None:
        tenant = session.get(Tenant, tenant_id) if tenant_id is not None else None
        return tenant.name if tenant is not None else None

    return GrantView(
        grant=grant,
        tenant=name(grant.grantee_tenant_id) or "",
        granted_by=name(grant.granted_by) or "",
        revoked_by=name(grant.revoked_by),
    )
