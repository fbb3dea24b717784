"""The invited tenant's side of sharing: list the invitations addressed to it, accept or decline.

Accepting is what gives the analyst role: nobody can put a dataset into another tenant's
listings or give it access without its consent.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Query

from api.problems import not_found
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from kernel.access.invitations import (
    Answer,
    InvitationNotFound,
    InvitationView,
    answer_invitation,
    pending_invitations,
)
from kernel.db.pagination import cursor_id, cursor_time, decode_cursor, encode_cursor
from kernel.schemas.datasets import BudgetOut
from kernel.schemas.grants import InvitationList, InvitationOut

router = APIRouter(prefix="/v1/invitations", tags=["invitations"], route_class=ReleasingRoute)
log = logging.getLogger("privtrain.api.invitations")


def _links(view: InvitationView) -> dict[str, str]:
    if view.status == "invited":
        base = f"/v1/invitations/{view.dataset_id}"
        return {"accept": f"{base}/accept", "decline": f"{base}/decline"}
    if view.status == "active":
        return {"dataset": f"/v1/datasets/{view.dataset_id}"}
    return {}


def invitation_out(view: InvitationView) -> InvitationOut:
    grant = view.grant
    return InvitationOut(
        id=view.dataset_id,
        dataset_id=view.dataset_id,
        dataset_name=view.dataset_name,
        owner=view.owner,
        budget=None if view.public else BudgetOut(epsilon=view.epsilon, delta=view.delta),
        public=view.public,
        invited_at=grant.granted_at,
        status=view.status,
        accepted_at=grant.accepted_at,
        declined_at=grant.declined_at,
        links=_links(view),
    )


@router.get("", response_model=InvitationList)
def list_invitations(
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> InvitationList:
    """Pending invitations addressed to the caller's tenant name, newest first: each names the
    dataset, its owner and its budget, nothing else about the data."""
    after = None
    if cursor:
        invited_at, dataset_id = decode_cursor(cursor, fields=(cursor_time, cursor_id))
        after = (invited_at, dataset_id)
    views = pending_invitations(session, tenant=tenant, limit=limit, after=after)
    next_cursor = None
    if len(views) > limit:
        last = views[limit - 1]
        next_cursor = encode_cursor([last.grant.granted_at.isoformat(), last.dataset_id])
    return InvitationList(items=[invitation_out(view) for view in views[:limit]], next_cursor=next_cursor)


def _answer(
    *, services: ServicesDep, session: SessionDep, tenant: TenantDep, invitation_id: str, answer: Answer
) -> InvitationOut:
    session.close()  # nothing to read first: the write transaction does it under the lock
    try:
        with services.db.write_transaction() as tx:
            out = invitation_out(answer_invitation(tx, tenant=tenant, dataset_id=invitation_id, answer=answer))
    except InvitationNotFound:
        raise not_found("invitation") from None
    log.info("invitation answered", extra={"dataset_id": out.dataset_id, "tenant_id": tenant.id, "answer": answer})
    return out


@router.post("/{invitation_id}/accept", response_model=InvitationOut)
def accept_invitation(
    invitation_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> InvitationOut:
    """Accept a pending invitation: the caller becomes an analyst of the dataset at once. 404 for
    anything that is not a pending invitation to the caller (already answered, withdrawn, meant
    for another tenant, or no such id): all answered alike."""
    return _answer(services=services, session=session, tenant=tenant, invitation_id=invitation_id, answer="accept")


@router.post("/{invitation_id}/decline", response_model=InvitationOut)
def decline_invitation(
    invitation_id: str, services: ServicesDep, session: SessionDep, tenant: TenantDep
) -> InvitationOut:
    """Decline a pending invitation; the owner sees ``declined`` in its audit trail and may invite
    again later. 404 exactly as for accept."""
    return _answer(services=services, session=session, tenant=tenant, invitation_id=invitation_id, answer="decline")
