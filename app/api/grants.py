"""Sharing a dataset with analyst tenants: the owner's grants and the audit trail they leave."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.access import dataset_for
from app.api.deps import ServicesDep, SessionDep, TenantDep
from app.api.routing import ReleasingRoute
from app.grants import GrantView, grant_access, grants_of, revoke_access
from app.schemas.datasets import GrantCreate, GrantList, GrantOut

router = APIRouter(prefix="/v1/datasets", tags=["grants"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.grants")


def grant_out(view: GrantView) -> GrantOut:
    grant = view.grant
    return GrantOut(
        dataset_id=grant.dataset_id,
        tenant=view.tenant,
        granted_at=grant.granted_at,
        granted_by=view.granted_by,
        revoked_at=grant.revoked_at,
        revoked_by=view.revoked_by,
        active=grant.revoked_at is None,
    )


@router.post(
    "/{dataset_id}/grants",
    status_code=201,
    response_model=GrantOut,
    responses={200: {"model": GrantOut, "description": "the tenant already holds an active grant"}},
)
def create_grant(
    dataset_id: str, body: GrantCreate, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> GrantOut | JSONResponse:
    """Owner only: give another tenant (by name) the analyst role on this dataset."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    session.close()  # give the read connection back before taking a write one
    with services.db.write_transaction() as tx:
        view, created = grant_access(tx, dataset=dataset, grantee_name=body.tenant, owner=tenant)
        out = grant_out(view)
    log.info("access granted", extra={"dataset_id": dataset.id, "tenant_id": tenant.id})
    if not created:
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    return out


@router.get("/{dataset_id}/grants", response_model=GrantList)
def list_grants(dataset_id: str, session: SessionDep, tenant: TenantDep) -> GrantList:
    """Owner only: every grant of the dataset, revoked ones included (the audit trail)."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    return GrantList(items=[grant_out(view) for view in grants_of(session, dataset.id)])


@router.delete("/{dataset_id}/grants/{grantee}", response_model=GrantOut)
def revoke_grant(
    dataset_id: str, grantee: str, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> GrantOut:
    """Owner only: revoke a tenant's active grant (the row stays, with ``revoked_at``). The
    analyst loses the dataset at once; it keeps read access to the jobs it already submitted."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    session.close()
    with services.db.write_transaction() as tx:
        out = grant_out(revoke_access(tx, dataset=dataset, grantee_name=grantee, owner=tenant))
    log.info("access revoked", extra={"dataset_id": dataset.id, "tenant_id": tenant.id})
    return out
