"""Concurrent-upload caps: a bounded count of uploads in flight, per tenant and in total.

Each upload is streamed to disk and then parsed in API memory (about twice its decompressed
size), so a handful at once is what bounds the API process's memory; rate limits count requests,
not this. A full registry refuses at once (429 with Retry-After) rather than queueing, so a
client never holds an open connection waiting for a slot.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, Request

from app.api.deps import ServicesDep, TenantDep
from app.problems import Problem

RETRY_AFTER_S = 10


class UploadSlotsFull(RuntimeError):
    """No upload slot is free for this tenant (``scope`` says which cap was reached)."""

    def __init__(self, *, scope: str, limit: int) -> None:
        super().__init__(f"{scope} limit of {limit} concurrent uploads reached")
        self.scope = scope
        self.limit = limit


class UploadSlots:
    """Bounded semaphores, one for the process and one per tenant, never waited on."""

    def __init__(self, *, total: int, per_tenant: int) -> None:
        self.total = total
        self.per_tenant = per_tenant
        self._lock = threading.Lock()
        self._in_flight = 0
        self._by_tenant: dict[str, int] = {}

    def acquire(self, tenant_id: str) -> None:
        """Take a slot or raise UploadSlotsFull; every acquire must be paired with a release."""
        with self._lock:
            held = self._by_tenant.get(tenant_id, 0)
            if held >= self.per_tenant:
                raise UploadSlotsFull(scope="per-tenant", limit=self.per_tenant)
            if self._in_flight >= self.total:
                raise UploadSlotsFull(scope="total", limit=self.total)
            self._by_tenant[tenant_id] = held + 1
            self._in_flight += 1

    def release(self, tenant_id: str) -> None:
        with self._lock:
            held = self._by_tenant.get(tenant_id, 0)
            if held < 1 or self._in_flight < 1:
                raise RuntimeError("upload slot released more often than acquired")
            if held == 1:
                del self._by_tenant[tenant_id]
            else:
                self._by_tenant[tenant_id] = held - 1
            self._in_flight -= 1

    def in_flight(self, tenant_id: str | None = None) -> int:
        with self._lock:
            return self._in_flight if tenant_id is None else self._by_tenant.get(tenant_id, 0)


def slots_of(app: FastAPI, *, total: int, per_tenant: int) -> UploadSlots:
    """The app's registry, made on first use (each app, and so each test client, has its own)."""
    slots = getattr(app.state, "upload_slots", None)
    if slots is None:
        slots = UploadSlots(total=total, per_tenant=per_tenant)
        app.state.upload_slots = slots
    return slots


async def upload_slot(
    request: Request, services: ServicesDep, tenant: TenantDep
) -> AsyncIterator[None]:
    """Dependency holding one upload slot for the whole request, released however it ends."""
    settings = services.settings
    slots = slots_of(
        request.app,
        total=settings.max_concurrent_uploads,
        per_tenant=settings.max_concurrent_uploads_per_tenant,
    )
    try:
        slots.acquire(tenant.id)
    except UploadSlotsFull as exc:
        raise Problem(
            status=429,
            slug="too-many-uploads",
            detail=f"too many uploads in progress ({exc.scope} limit {exc.limit}); retry in "
            f"{RETRY_AFTER_S} s",
            headers={"Retry-After": str(RETRY_AFTER_S)},
            extra={"limit": exc.limit, "scope": exc.scope},
        ) from exc
    try:
        yield
    finally:
        slots.release(tenant.id)


UploadSlotDep = Annotated[None, Depends(upload_slot)]
