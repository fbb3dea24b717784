"""Caps on privacy computations in flight: per API key and in total, per API process.

Why: pricing a job (calibrating σ to a target ε, the largest admissible ε, the admissibility
searches of an estimate) evaluates Rényi curves, each up to about 0.1 s of pure-Python CPU at
fractional orders. Every such computation is bounded (ranges and bracketed searches), but forty of
them at once from one key used to fill the thread pool that every sync route shares and hold the
interpreter lock, so ``/healthz`` and other tenants waited seconds. With a few slots per process,
the rest of the service keeps its threads and most of the CPU; a caller beyond the cap gets 429
``too-many-computations`` with ``Retry-After`` at once, before authentication or any database work.

The principal is the Bearer key's digest (as for the rate limit), taken only once the request cap
(:mod:`api.limits.request_cap`) has found an active key behind it: a request with an unknown or revoked
key takes no pricing slot at all (the route answers 401 without computing), so a flood of random
keys cannot hold the process's few slots and keep every real key from pricing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from api.limits.capped_slots import CappedSlots, SlotsFull
from api.limits.rate_limit import bearer_principal
from api.limits.request_cap import known_unverified
from api.routes.slot_problems import app_registry, slots_full_problem
from kernel.config import Settings

__all__ = ["RETRY_AFTER_S", "PlanningSlotDep", "planning_slots_of"]

RETRY_AFTER_S = 2


def planning_slots_of(app: FastAPI, settings: Settings) -> CappedSlots:
    """The app's registry, made on first use (each app, and so each test, has its own)."""
    return app_registry(
        app,
        attribute="planning_slots",
        make=lambda: CappedSlots(
            total=settings.max_concurrent_plans,
            per_owner=settings.max_concurrent_plans_per_key,
            owner_scope="per-key",
            what="privacy computations",
        ),
    )


async def planning_slot(request: Request) -> AsyncIterator[None]:
    """Hold a slot while the route runs (estimates and submissions), or answer 429.

    Released when the route returns, before its answer is sent (``scope="function"`` below): a
    request-scoped ``yield`` dependency is closed only after the response has gone out, so a
    client sending its next submission as soon as it read the answer found its own slot still
    held about one time in ten and got 429 with "per-key limit 1" (issue 36)."""
    principal = bearer_principal(request.scope)
    if principal is None or known_unverified(request.scope):  # the route answers 401 without computing
        yield
        return
    slots = planning_slots_of(request.app, request.app.state.services.settings)
    try:
        slots.acquire(principal)
    except SlotsFull as exc:
        raise slots_full_problem(
            exc,
            slug="too-many-computations",
            summary="too many privacy computations in flight",
            advice=f"pricing a job takes up to a few seconds, so wait for your other estimates or submissions "
            f"and retry in {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S,
        ) from exc
    try:
        yield
    finally:
        slots.release(principal)


PlanningSlotDep = Annotated[None, Depends(planning_slot, scope="function")]
