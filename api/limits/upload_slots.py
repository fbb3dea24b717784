"""Concurrent-upload caps: a bounded count of uploads in flight, per tenant and in total.

Each upload is streamed to disk and then parsed in API memory (about twice its decompressed
size), so a handful at once is what bounds the API process's memory; rate limits count requests,
not this. A full registry refuses at once (429 with Retry-After) rather than queueing, so a
client never holds an open connection waiting for a slot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from api.limits.capped_slots import CappedSlots, SlotsFull
from api.routes.deps import ServicesDep, TenantDep
from api.routes.slot_problems import app_registry, slots_full_problem

RETRY_AFTER_S = 10


UploadSlotsFull = SlotsFull
"""No upload slot is free for this tenant (``scope``: ``per-tenant`` or ``total``)."""


class UploadSlots(CappedSlots):
    """Upload slots: one count for the process and one per tenant (api.limits.capped_slots)."""

    def __init__(self, *, total: int, per_tenant: int) -> None:
        super().__init__(total=total, per_owner=per_tenant, owner_scope="per-tenant", what="uploads")

    @property
    def per_tenant(self) -> int:
        return self.per_owner


def slots_of(app: FastAPI, *, total: int, per_tenant: int) -> UploadSlots:
    """The app's registry, made on first use (each app, and so each test client, has its own)."""
    return app_registry(app, attribute="upload_slots", make=lambda: UploadSlots(total=total, per_tenant=per_tenant))


async def upload_slot(request: Request, services: ServicesDep, tenant: TenantDep) -> AsyncIterator[None]:
    """Dependency holding one upload slot while the route runs, released however it ends and
    before its answer is sent (``scope="function"`` below): a client that sends its next upload
    as soon as it reads the answer never finds its own slot still held."""
    settings = services.settings
    slots = slots_of(
        request.app,
        total=settings.max_concurrent_uploads,
        per_tenant=settings.max_concurrent_uploads_per_tenant,
    )
    try:
        slots.acquire(tenant.id)
    except UploadSlotsFull as exc:
        raise slots_full_problem(
            exc,
            slug="too-many-uploads",
            summary="too many uploads in progress",
            advice=f"retry in {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S,
        ) from exc
    try:
        yield
    finally:
        slots.release(tenant.id)


UploadSlotDep = Annotated[None, Depends(upload_slot, scope="function")]
