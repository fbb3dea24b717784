"""Liveness, readiness and Prometheus metrics.

None of them waits behind tenants' requests: they are not counted by the request cap
(:mod:`api.limits.request_cap`), ``/healthz`` does no I/O and runs on the event loop, and the database
work of ``/readyz`` and ``/metrics`` runs in threads under a limiter of their own
(``PROBE_THREADS``), never under the limiter that Starlette's sync routes share.
"""

from __future__ import annotations

import hmac
from typing import Any

import anyio.to_thread
from anyio import CapacityLimiter
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from api.problems import Problem
from api.routes.deps import ServicesDep
from kernel.bootstrap import migration_head
from kernel.service_metrics import collect_metrics

router = APIRouter(tags=["health"])

MIN_FREE_DISK_BYTES = 256 * 1024 * 1024
PROBE_THREADS = 4
"""Threads the probes' checks may use at once, their own (a scraper and two orchestrator probes)."""


def probe_limiter_of(app: FastAPI) -> CapacityLimiter:
    """The app's probe limiter, made on first use (inside the serving event loop)."""
    limiter = getattr(app.state, "probe_limiter", None)
    if limiter is None:
        limiter = CapacityLimiter(PROBE_THREADS)
        app.state.probe_limiter = limiter
    return limiter


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: no I/O, so a slow database never gets the process restarted; answered on the
    event loop, so a thread pool busy with slow requests does not make the process look dead."""
    return {"status": "ok"}


def _check_database(services: Any) -> None:
    with services.db.read_session() as session:
        session.execute(text("SELECT 1"))


def _check_migrations(services: Any) -> None:
    """The schema is at the head this code expects (an API on an old schema must not serve)."""
    with services.db.read_session() as session:
        current = session.execute(text("SELECT version_num FROM alembic_version")).scalar()
    if current != migration_head():
        raise RuntimeError("the database schema is not at this version's migration head")


def _check_broker(services: Any) -> None:
    ping = getattr(services.dispatcher, "ping", None)
    if ping is not None:
        ping()


def _check_disk(services: Any) -> None:
    if services.blobs.free_bytes() < MIN_FREE_DISK_BYTES:
        raise RuntimeError("less than 256 MiB free")


def _check_storage(services: Any) -> None:
    """The blob store answers (a lookup of a key that never exists; an object store's outage
    raises StorageUnavailable)."""
    services.blobs.exists(services.blobs.key_for("0" * 64))


@router.get("/readyz")
async def readyz(services: ServicesDep, request: Request) -> JSONResponse:
    checks: dict[str, str] = {}
    for name, check in (
        ("database", _check_database),
        ("migrations", _check_migrations),
        ("broker", _check_broker),
        ("disk", _check_disk),
        ("storage", _check_storage),
    ):
        try:
            await anyio.to_thread.run_sync(check, services, limiter=probe_limiter_of(request.app))
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - readiness must report any failing dependency (by name, not detail)
            checks[name] = f"unavailable: {type(exc).__name__}"
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status_code=200 if ready else 503
    )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format",
        }
    },
)
async def metrics(services: ServicesDep, request: Request) -> Response:
    token = services.settings.metrics_token
    if token is not None:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), token.get_secret_value().encode()
        ):
            raise Problem(
                status=401,
                slug="unauthorized",
                detail="/metrics needs the metrics token",
                headers={"WWW-Authenticate": "Bearer"},
            )
    exposition = await anyio.to_thread.run_sync(
        _exposition, services, token is not None, limiter=probe_limiter_of(request.app)
    )
    return Response(exposition, media_type=CONTENT_TYPE_LATEST)


def _exposition(services: Any, per_dataset: bool) -> bytes:
    with services.db.read_session() as session:
        registry = collect_metrics(session, per_dataset=per_dataset)
    return generate_latest(registry)
