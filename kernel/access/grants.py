"""Inviting analysts to a dataset and ending their access: the owner's side of sharing.

Why invitations: an owner names a tenant, and the row is stored under that name whether or not
such a tenant exists. Nothing on this path looks the name up, so the answer (and its timing)
says nothing about which tenants exist; and access starts only when the named tenant accepts
(kernel/access/invitations.py), so nobody can push datasets into another tenant's listings.

Why the budget row is locked: a grant decides who may spend the dataset's budget, and admission
(POST /v1/jobs) re-checks the caller's access under the same row lock. So invitations, answers
to them, revokes and submissions are serialised: once a revoke has committed, no job of the
revoked analyst can be admitted, even one whose request was already in flight.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session, aliased

from kernel.datasets.status import require_active
from kernel.db.orm import Dataset, DatasetGrant, Tenant, utcnow
from kernel.ledger import operations as ledger

GrantStatus = Literal["invited", "active", "declined", "revoked"]

MAX_TENANT_NAME_CHARS = 200
"""The length of ``tenants.name`` and ``dataset_grants.grantee_name``."""

_STATUS_RULES: tuple[tuple[GrantStatus, Callable[[DatasetGrant], bool]], ...] = (
    ("revoked", lambda grant: grant.revoked_at is not None),  # withdrawn, or access revoked
    ("declined", lambda grant: grant.declined_at is not None),
    ("active", lambda grant: grant.accepted_at is not None),
)
"""First match wins; a row none of them matches is a pending invitation."""


class GrantError(Exception):
    """A refused change to a dataset's grants; the API edge turns it into a problem."""


class SelfInvitation(GrantError):
    """The owner named its own tenant (that only tells the owner its own name)."""


class ImplausibleName(GrantError):
    """A name no tenant can have (empty, too long, control characters)."""


class NoLiveGrant(GrantError):
    """No pending invitation or active grant for that name on the dataset."""


def grant_status(grant: DatasetGrant) -> GrantStatus:
    return next((status for status, applies in _STATUS_RULES if applies(grant)), "invited")


def is_live() -> ColumnElement[bool]:
    """SQL filter: a pending invitation or an active grant (neither revoked nor declined)."""
    return and_(DatasetGrant.revoked_at.is_(None), DatasetGrant.declined_at.is_(None))


def is_pending() -> ColumnElement[bool]:
    """SQL filter: an invitation still waiting for the named tenant's answer."""
    return and_(is_live(), DatasetGrant.accepted_at.is_(None))


def is_plausible_tenant_name(name: str) -> bool:
    """Names a tenant can have: 1 to 200 characters, no control characters or lone surrogates
    (the database could not even compare those, so they are refused before any query)."""
    return 0 < len(name) <= MAX_TENANT_NAME_CHARS and not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name)


@dataclass(frozen=True)
class GrantView:
    """A grant row with tenant names instead of ids (owners know tenants by name)."""

    grant: DatasetGrant
    granted_by: str
    revoked_by: str | None

    @property
    def tenant(self) -> str:
        """The name the owner typed; never looked up, so it reveals nothing about other tenants."""
        return self.grant.grantee_name

    @property
    def status(self) -> GrantStatus:
        return grant_status(self.grant)


def _live_grant(session: Session, *, dataset_id: str, grantee_name: str) -> DatasetGrant | None:
    return session.scalar(
        select(DatasetGrant).where(
            DatasetGrant.dataset_id == dataset_id, DatasetGrant.grantee_name == grantee_name, is_live()
        )
    )


def invite(session: Session, *, dataset: Dataset, grantee_name: str, owner: Tenant) -> tuple[GrantView, bool]:
    """Invite the tenant named ``grantee_name``; (the invitation, whether it is new).

    Inviting a name that already has a pending invitation or an active grant returns that row
    unchanged, so retries are safe. A concurrent invitation of the same name that commits first
    makes the insert fail on the partial unique index: the caller answers with
    :func:`live_grant_view` then (a replay).
    """
    if not is_plausible_tenant_name(grantee_name):
        raise ImplausibleName("a tenant name has 1 to 200 characters and no control characters")
    if grantee_name == owner.name:
        raise SelfInvitation("the owner of a dataset cannot invite itself")
    ledger.lock_budget(session, dataset.id)
    current = session.get(Dataset, dataset.id, populate_existing=True)
    assert current is not None
    require_active(current)  # a deleted dataset is shared with nobody (its deletion ended every grant)
    existing = _live_grant(session, dataset_id=dataset.id, grantee_name=grantee_name)
    if existing is not None:
        return _view(session, existing), False
    grant = DatasetGrant(dataset_id=dataset.id, grantee_name=grantee_name, granted_by=owner.id, granted_at=utcnow())
    session.add(grant)
    session.flush()
    return _view(session, grant), True


def live_grant_view(session: Session, *, dataset_id: str, grantee_name: str) -> GrantView | None:
    """The pending invitation or active grant for that name, if any."""
    grant = _live_grant(session, dataset_id=dataset_id, grantee_name=grantee_name)
    return _view(session, grant) if grant is not None else None


def end_access(session: Session, *, dataset: Dataset, grantee_name: str, owner: Tenant) -> GrantView:
    """Revoke the active grant, or withdraw the pending invitation, of that name. The row stays
    with ``revoked_at`` (audit trail); a later invitation adds a new row."""
    if not is_plausible_tenant_name(grantee_name):
        raise NoLiveGrant("grant not found")
    ledger.lock_budget(session, dataset.id)
    grant = _live_grant(session, dataset_id=dataset.id, grantee_name=grantee_name)
    if grant is None:
        raise NoLiveGrant("grant not found")
    grant.revoked_at = utcnow()
    grant.revoked_by = owner.id
    session.flush()
    return _view(session, grant)


def grants_page(session: Session, *, dataset_id: str, offset: int, limit: int) -> list[GrantView]:
    """The dataset's grants in the order they were made (revoked and declined ones included),
    from position ``offset``: at most ``limit`` + 1 rows, so the caller knows if more follow.

    A position is a stable cursor here: rows are never deleted, and every insert for a dataset
    happens under its budget lock, so new rows only ever join at the end.
    """
    granter, revoker = aliased(Tenant), aliased(Tenant)
    rows = session.execute(
        select(DatasetGrant, granter.name, revoker.name)
        .join(granter, granter.id == DatasetGrant.granted_by)
        .outerjoin(revoker, revoker.id == DatasetGrant.revoked_by)
        .where(DatasetGrant.dataset_id == dataset_id)
        .order_by(DatasetGrant.id)
        .offset(offset)
        .limit(limit + 1)
    ).all()
    return [GrantView(grant=grant, granted_by=by, revoked_by=revoked_by) for grant, by, revoked_by in rows]


def _view(session: Session, grant: DatasetGrant) -> GrantView:
    def name(tenant_id: str | None) -> str | None:
        tenant = session.get(Tenant, tenant_id) if tenant_id is not None else None
        return tenant.name if tenant is not None else None

    return GrantView(grant=grant, granted_by=name(grant.granted_by) or "", revoked_by=name(grant.revoked_by))
