"""``POST /v1/jobs/{id}/generate``: sample text from a succeeded language-model job's released model.

Each request runs a model in a child process, so it has its own per-key budget (a token bucket
besides the service-wide rate limit) and a cap on processes in flight per API process; both answer
429 with ``Retry-After``. They are spent only once the request passed its checks (a refused
request runs nothing, and the service-wide limit already bounds those).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, FastAPI, Request

from api.limits.capped_slots import CappedSlots, SlotsFull
from api.limits.rate_limit import RateLimiter, bearer_principal
from api.problems import Problem
from api.routes.deps import ServicesDep, SessionDep, TenantDep
from api.routes.routing import ReleasingRoute
from api.routes.slot_problems import app_registry, slots_full_problem
from kernel.config import Settings
from kernel.jobs.generation import (
    GenerationLimits,
    GenerationRequest,
    generate,
    generation_target,
)
from kernel.schemas.generation import GenerateRequest, GenerateResponse

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=ReleasingRoute)

BUSY_RETRY_AFTER_S = 5
CHILD_CPU_S = 120
CHILD_ADDRESS_SPACE_BYTES = 16 * 1024**3
"""Generous: importing torch maps gigabytes of virtual memory before the model loads."""


def _budget_of(app: FastAPI, settings: Settings) -> RateLimiter:
    return app_registry(
        app,
        attribute="generation_budget",
        make=lambda: RateLimiter(per_minute=settings.generation_per_minute, burst=settings.generation_burst),
    )


def _slots_of(app: FastAPI, settings: Settings) -> CappedSlots:
    return app_registry(
        app,
        attribute="generation_slots",
        make=lambda: CappedSlots(
            total=settings.generation_max_concurrent, per_owner=1, owner_scope="per-key", what="text generations"
        ),
    )


@contextmanager
def _generation_turn(app: FastAPI, settings: Settings, principal: str) -> Iterator[None]:
    """Spend one token of the key's generation budget and hold a process slot meanwhile, or 429."""
    wait = _budget_of(app, settings).acquire(principal)
    if wait is not None:
        retry_after = max(1, math.ceil(wait))
        raise Problem(
            status=429,
            slug="generation-rate-limited",
            detail=f"this API key may generate text {settings.generation_per_minute:g} times a minute "
            f"(bursts of {settings.generation_burst}); retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
            extra={"retry_after_s": retry_after},
        )
    slots = _slots_of(app, settings)
    try:
        slots.acquire(principal)
    except SlotsFull as exc:
        raise slots_full_problem(
            exc,
            slug="too-many-generations",
            summary="too many text generations in flight",
            advice=f"wait for your other generation to finish and retry in {BUSY_RETRY_AFTER_S} s",
            retry_after_s=BUSY_RETRY_AFTER_S,
        ) from exc
    try:
        yield
    finally:
        slots.release(principal)


@router.post("/{job_id}/generate", response_model=GenerateResponse)
def generate_text(
    job_id: str,
    body: GenerateRequest,
    request: Request,
    services: ServicesDep,
    session: SessionDep,
    tenant: TenantDep,
) -> GenerateResponse:
    """Continue ``prompt`` with up to ``max_tokens`` tokens sampled from the job's released model.
    Post-processing of the released model: nothing is charged or stored."""
    target = generation_target(session, tenant, job_id, blobs=services.blobs)
    session.commit()  # no database connection is held while the model runs
    settings = services.settings
    principal = bearer_principal(request.scope)
    assert principal is not None  # the tenant was authenticated by this Bearer key
    with _generation_turn(request.app, settings, principal):
        generated = generate(
            target,
            GenerationRequest(
                prompt=body.prompt, max_tokens=body.max_tokens, temperature=body.temperature, top_k=body.top_k
            ),
            limits=GenerationLimits(
                timeout_s=settings.generation_timeout_s,
                cpu_s=CHILD_CPU_S,
                address_space_bytes=CHILD_ADDRESS_SPACE_BYTES,
            ),
        )
    return GenerateResponse(
        text=generated.text,
        prompt=body.prompt,
        tokens_generated=generated.tokens_generated,
        model_sha256=target.model_sha256,
        statement=target.statement,
    )
