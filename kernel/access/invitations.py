"""Invitations addressed to a tenant, and its answers: the analyst's side of sharing.

An invitation is addressed to a tenant *name* (kernel/access/grants.py); the tenant that holds the name
sees it, and accepting it is what gives the analyst role. Until then the dataset stays out of
the tenant's listings and gives it no access at all.

An invitation is identified by its dataset's id: a name has at most one live row per dataset (a
partial unique index), so the pair (caller, dataset id) names it, and no row counter leaks.
Anything that is not a pending invitation to the caller answers exactly like an id that never
existed.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Row, Select, and_, or_, select
from sqlalchemy.orm import Session, aliased

from kernel.access.grants import GrantStatus, grant_status, is_pending
from kernel.db.orm import Dataset, DatasetGrant, PrivacyBudget, Tenant, utcnow
from kernel.ledger import operations as ledger

Answer = Literal["accept", "decline"]

_DATASET_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class InvitationNotFound(Exception):
    """No pending invitation to the caller for that id (whatever the reason)."""


def _accept(grant: DatasetGrant, tenant: Tenant, now: dt.datetime) -> None:
    grant.grantee_tenant_id = tenant.id
    grant.accepted_at = now


def _decline(grant: DatasetGrant, _tenant: Tenant, now: dt.datetime) -> None:
    grant.declined_at = now


ANSWERS: Mapping[Answer, Callable[[DatasetGrant, Tenant, dt.datetime], None]] = {
    "accept": _accept,
    "decline": _decline,
}


@dataclass(frozen=True)
class InvitationView:
    """What the invited tenant may know before answering: public facts only."""

    grant: DatasetGrant
    dataset_name: str
    owner: str
    epsilon: float
    delta: float
    public: bool = False
    """The dataset was declared public: it has no budget (``epsilon``/``delta`` are meaningless)."""

    @property
    def dataset_id(self) -> str:
        return self.grant.dataset_id

    @property
    def status(self) -> GrantStatus:
        return grant_status(self.grant)


def _views() -> Select[DatasetGrant, str, str, float, float, bool]:
    """Invitations with their dataset's name, owner and budget; the columns only, so a dataset's
    feature names (megabytes on a wide one) are never loaded for a listing."""
    owner = aliased(Tenant)
    return (
        select(DatasetGrant, Dataset.name, owner.name, PrivacyBudget.epsilon, PrivacyBudget.delta, Dataset.public)
        .join(Dataset, Dataset.id == DatasetGrant.dataset_id)
        .join(owner, owner.id == Dataset.tenant_id)
        .join(PrivacyBudget, PrivacyBudget.dataset_id == Dataset.id)
    )


def _view(row: Row[DatasetGrant, str, str, float, float, bool]) -> InvitationView:
    grant, dataset_name, owner, epsilon, delta, public = row
    return InvitationView(
        grant=grant, dataset_name=dataset_name, owner=owner, epsilon=epsilon, delta=delta, public=bool(public)
    )


def pending_invitations(
    session: Session, *, tenant: Tenant, limit: int, after: tuple[dt.datetime, str] | None = None
) -> list[InvitationView]:
    """Pending invitations to the tenant's name, newest first, after the keyset cursor
    (invited_at, dataset id): at most ``limit`` + 1, so the caller knows if more follow."""
    query = _views().where(DatasetGrant.grantee_name == tenant.name, is_pending())
    if after is not None:
        invited_at, dataset_id = after
        query = query.where(
            or_(
                DatasetGrant.granted_at < invited_at,
                and_(DatasetGrant.granted_at == invited_at, DatasetGrant.dataset_id < dataset_id),
            )
        )
    rows = session.execute(
        query.order_by(DatasetGrant.granted_at.desc(), DatasetGrant.dataset_id.desc()).limit(limit + 1)
    ).all()
    return [_view(row) for row in rows]


def _pending_to(session: Session, *, tenant: Tenant, dataset_id: str) -> DatasetGrant | None:
    return session.scalar(
        select(DatasetGrant).where(
            DatasetGrant.dataset_id == dataset_id, DatasetGrant.grantee_name == tenant.name, is_pending()
        )
    )


def answer_invitation(session: Session, *, tenant: Tenant, dataset_id: str, answer: Answer) -> InvitationView:
    """Accept or decline the pending invitation to the caller for this dataset.

    Under the dataset's budget lock, like every change of who may spend the budget: an answer
    and the owner's withdrawal cannot both win, and an accepted grant is visible to the next
    admission. The first look, before the lock, only avoids locking for ids that name nothing.
    """
    if _DATASET_ID.fullmatch(dataset_id) is None:
        raise InvitationNotFound
    if _pending_to(session, tenant=tenant, dataset_id=dataset_id) is None:
        raise InvitationNotFound
    ledger.lock_budget(session, dataset_id)
    grant = _pending_to(session, tenant=tenant, dataset_id=dataset_id)  # a withdrawal may have won
    if grant is None:
        raise InvitationNotFound
    ANSWERS[answer](grant, tenant, utcnow())
    session.flush()
    return _view(session.execute(_views().where(DatasetGrant.id == grant.id)).one())
