"""Shared dependencies: services, the caller's tenant, tenant-scoped lookups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.problems import Problem, not_found
from kernel.access.keys import tenant_for_key
from kernel.db.orm import Dataset, Job, Tenant
from kernel.services import Services


async def get_services(request: Request) -> Services:
    """Async although it does no I/O: a sync dependency is run in the shared thread pool, and this
    one is on every route (one hop fewer per request, fewer waits for the interpreter lock)."""
    services: Services = request.app.state.services  # set by the app factory; State is untyped
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    with services.db.read_session() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def _unauthorized(detail: str) -> Problem:
    return Problem(status=401, slug="unauthorized", detail=detail, headers={"WWW-Authenticate": "Bearer"})


BEARER = HTTPBearer(
    auto_error=False,  # the problems below say what is wrong, in the service's own format
    scheme_name="bearer",
    description="an API key: `Authorization: Bearer <key>` (privtrain-admin create-key, or the key `serve` prints)",
)
"""The OpenAPI security scheme every authenticated route declares (the Authorize button of /docs)."""


def get_tenant(
    request: Request, session: SessionDep, _declared: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
) -> Tenant:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise _unauthorized("missing Authorization: Bearer <api key>")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("malformed Authorization header; expected 'Bearer <api key>'")
    tenant = tenant_for_key(session, token.strip())
    session.commit()  # end the read transaction: no connection is held while a body streams in
    if tenant is None:
        raise _unauthorized("invalid or revoked API key")
    return tenant


TenantDep = Annotated[Tenant, Depends(get_tenant)]


def dataset_of_tenant(session: Session, tenant: Tenant, dataset_id: str) -> Dataset:
    dataset = session.scalar(select(Dataset).where(Dataset.id == dataset_id, Dataset.tenant_id == tenant.id))
    if dataset is None:
        raise not_found("dataset")
    return dataset


def job_of_tenant(session: Session, tenant: Tenant, job_id: str) -> Job:
    job = session.scalar(select(Job).where(Job.id == job_id, Job.tenant_id == tenant.id))
    if job is None:
        raise not_found("job")
    return job
