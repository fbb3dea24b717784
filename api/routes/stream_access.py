"""Who may keep reading a job's event stream, re-checked at every poll (api.routes.event_stream).

Each rule is built when the stream opens and returns an ``AccessCheck``: a function of the poll's
read session, true while the principal may still read the job. The rules are the routes' own:
``kernel.access.roles.job_for`` for ``/v1`` and the dashboard's tenant scoping for ``/ui``, called, not
copied, so a change to the grant rules reaches open streams too.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.requests import Request

from api.limits.rate_limit import bearer_principal
from api.problems import Problem
from api.routes.deps import job_of_tenant
from api.routes.event_stream import AccessCheck
from kernel.access.dashboard_sessions import live_session_by_id
from kernel.access.roles import job_for
from kernel.db.orm import ApiKey, Job, Tenant
from kernel.errors import DomainError

__all__ = ["api_reader", "bearer_key_digest", "dashboard_reader"]


def bearer_key_digest(request: Request) -> str | None:
    """The digest of the request's Bearer key (as the database stores it), if it sends one."""
    return bearer_principal(request.scope)


def _active_key_tenant(session: Session, key_digest: str) -> Tenant | None:
    api_key = session.scalar(select(ApiKey).where(ApiKey.digest == key_digest))
    if api_key is None or api_key.revoked_at is not None:
        return None
    return session.get(Tenant, api_key.tenant_id)


def _allowed(lookup: Callable[[], Job]) -> bool:
    """True if the lookup finds the job; the routes' 404/403 refusals mean access is lost."""
    try:
        lookup()
    except (DomainError, Problem):  # kernel.access.roles raises domain errors, the /ui lookups problems
        return False
    return True


def api_reader(*, key_digest: str, job_id: str) -> AccessCheck:
    """``/v1``: the key is not revoked and its tenant may still read the job."""

    def still_allowed(session: Session) -> bool:
        tenant = _active_key_tenant(session, key_digest)
        return tenant is not None and _allowed(lambda: job_for(session, tenant, job_id, need="read"))

    return still_allowed


def dashboard_reader(*, ui_session_id: str | None, key_digest: str, job_id: str) -> AccessCheck:
    """``/ui``: the dashboard session is live (not logged out, not expired, key not revoked) or,
    for a script's Bearer key (``ui_session_id`` None), the key is not revoked; and the job is
    still the tenant's."""

    def still_allowed(session: Session) -> bool:
        if ui_session_id is not None:
            live = live_session_by_id(session, ui_session_id)
            tenant = session.get(Tenant, live.tenant_id) if live is not None else None
        else:
            tenant = _active_key_tenant(session, key_digest)
        return tenant is not None and _allowed(lambda: job_of_tenant(session, tenant, job_id))

    return still_allowed
