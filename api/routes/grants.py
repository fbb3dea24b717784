"""Sharing a dataset: the owner invites analyst tenants by name, revokes them, and reads the
audit trail of every invitation and grant."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.exc import IntegrityError

from api.problems import Problem, not_found
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from kernel.access.grants import (
    GrantError,
    GrantView,
    ImplausibleName,
    NoLiveGrant,
    SelfInvitation,
    end_access,
    grants_page,
    invite,
    live_grant_view,
)
from kernel.access.roles import dataset_for
from kernel.db.pagination import cursor_seq, decode_cursor, encode_cursor
from kernel.schemas.grants import GrantCreate, GrantList, GrantOut

router = APIRouter(prefix="/v1/datasets", tags=["grants"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.grants")

GRANT_PROBLEMS: Mapping[type[GrantError], Callable[[], Problem]] = {
    SelfInvitation: lambda: Problem(
        status=422, slug="invalid-grant", detail="the owner of a dataset cannot invite itself"
    ),
    ImplausibleName: lambda: Problem(
        status=422, slug="invalid-grant", detail="a tenant name has 1 to 200 characters and no control characters"
    ),
    NoLiveGrant: lambda: not_found("grant"),
}


def grant_problem(error: GrantError) -> Problem:
    return GRANT_PROBLEMS[type(error)]()


def grant_out(view: GrantView) -> GrantOut:
    grant = view.grant
    return GrantOut(
        dataset_id=grant.dataset_id,
        tenant=view.tenant,
        status=view.status,
        active=view.status == "active",
        granted_at=grant.granted_at,
        granted_by=view.granted_by,
        accepted_at=grant.accepted_at,
        declined_at=grant.declined_at,
        revoked_at=grant.revoked_at,
        revoked_by=view.revoked_by,
    )


@router.post(
    "/{dataset_id}/grants",
    status_code=202,
    response_model=GrantOut,
    responses={
        200: {"model": GrantOut, "description": "that name already has a pending invitation or an active grant"}
    },
)
def create_grant(
    dataset_id: str, body: GrantCreate, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> GrantOut | JSONResponse:
    """Owner only: invite a tenant (by name) to take the analyst role on this dataset.

    202 with the invitation (status ``invited``) whether or not a tenant of that name exists:
    the name is not looked up, so the answer tells nothing about other tenants. Access starts
    only when that tenant accepts (``POST /v1/invitations/{dataset_id}/accept``).
    """
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    session.close()  # give the read connection back before taking a write one
    try:
        with services.db.write_transaction() as tx:
            view, created = invite(tx, dataset=dataset, grantee_name=body.tenant, owner=tenant)
            out = grant_out(view)
    except GrantError as exc:
        raise grant_problem(exc) from None
    except IntegrityError:
        # A concurrent invitation of the same name committed first (the partial unique index):
        # answer with that one, as a replay.
        with services.db.read_session() as again:
            replay = live_grant_view(again, dataset_id=dataset.id, grantee_name=body.tenant)
            if replay is None:
                raise
            out, created = grant_out(replay), False
    log.info(
        "invitation sent" if created else "invitation replayed",
        extra={"dataset_id": dataset.id, "tenant_id": tenant.id},
    )
    if not created:
        return JSONResponse(out.model_dump(mode="json"), status_code=200)
    return out


@router.get("/{dataset_id}/grants", response_model=GrantList)
def list_grants(
    dataset_id: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> GrantList:
    """Owner only: every invitation and grant of the dataset in the order they were made,
    withdrawn, declined and revoked ones included (the audit trail)."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    (offset,) = decode_cursor(cursor, fields=(cursor_seq,)) if cursor else (0,)
    views = grants_page(session, dataset_id=dataset.id, offset=offset, limit=limit)
    next_cursor = encode_cursor([offset + limit]) if len(views) > limit else None
    return GrantList(items=[grant_out(view) for view in views[:limit]], next_cursor=next_cursor)


@router.delete("/{dataset_id}/grants/{grantee}", response_model=GrantOut)
def revoke_grant(
    dataset_id: str, grantee: str, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> GrantOut:
    """Owner only: revoke a tenant's active grant, or withdraw its pending invitation (the row
    stays, with ``revoked_at``). A revoked analyst loses the dataset at once; it keeps read
    access to the jobs it already submitted."""
    dataset = dataset_for(session, tenant, dataset_id, need="own")
    session.close()
    try:
        with services.db.write_transaction() as tx:
            out = grant_out(end_access(tx, dataset=dataset, grantee_name=grantee, owner=tenant))
    except GrantError as exc:
        raise grant_problem(exc) from None
    log.info("access ended", extra={"dataset_id": dataset.id, "tenant_id": tenant.id})
    return out
