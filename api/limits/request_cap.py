"""Per-principal caps on requests in flight, enforced before a request reaches any route.

Why: the rate limit counts requests, not concurrency. One key holding 30 ordinary dashboard and
API GETs open at once stayed under it (13 requests/s) yet pushed ``/healthz`` p99 to seconds and
another tenant's to 2.4–5.5 s (issue 36): every sync route runs in the one thread pool Starlette
and AnyIO share (40 threads), and 30 threads of one tenant's rendering hold the interpreter lock
most of the time. Now each principal may have only a few requests in flight; the rest are
answered 429 ``too-many-concurrent-requests`` with ``Retry-After`` at once, on the event loop,
before routing, authentication or any thread is taken.

Who counts as whom:

- A request with a verified API key (Bearer, or the key a signed dashboard cookie names) counts
  against its key, its key's tenant (so many keys of one tenant share one cap) and the process.
  The key is verified against the database once and remembered (:mod:`kernel.access.verified_keys`).
- Any other request (no key, an unknown or revoked key, a forged cookie) counts against its client
  address and against a cap for all unverified requests together. So a flood of random keys
  cannot lock a key's owner out: it never touches the owner's counters, whatever key it presents,
  and it can take at most the unverified share of the process.
- ``/healthz``, ``/readyz`` and ``/metrics`` are not counted (their work runs on the event loop
  or under a thread limiter of their own: :mod:`api.routes.health`).

The slots are released when the last byte of the answer is handed to the server, before the
client can read it, so a client that waits for each answer never meets its own previous request.
An event stream gives its request slot back once it starts streaming (``release_request_slot``):
from then on it waits without a thread and counts against the stream caps
(:mod:`api.routes.stream_slots`).

The caps are per API process; behind a balancer a principal's effective cap is the sum. Behind a
reverse proxy the client address must be the real one (uvicorn's ``--forwarded-allow-ips``),
or every unverified request shares the proxy's address.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.limits.capped_slots import SlotsFull
from api.limits.rate_limit import EXEMPT_PATHS, PrincipalOf
from api.limits.request_slots import Claim, RequestSlots
from api.problems import problem_response
from api.routes.slot_problems import slots_full_problem
from kernel.access.verified_keys import KnownKeys, VerifiedKey

__all__ = [
    "RETRY_AFTER_S",
    "RequestCapMiddleware",
    "RequestCaps",
    "claim_of",
    "known_unverified",
    "release_request_slot",
    "verified_key_of",
]

RETRY_AFTER_S = 1
SLOT_KEY = "privtrain.request_slot"
"""The ASGI scope entry holding the request's slot (an extension key: no other code sets it)."""
VERIFIED_KEY = "privtrain.verified_key"
"""The ASGI scope entry holding the request's verified key, or None when unverified."""
UNKNOWN_ADDRESS = "unknown"

log = logging.getLogger("privtrain.request_cap")


class RequestCaps:
    """The limits of each scope (settings ``max_concurrent_requests*``)."""

    PER_KEY = "per-key"
    PER_TENANT = "per-tenant"
    PER_ADDRESS = "per-address"
    UNVERIFIED = "unverified"
    TOTAL = "total"

    @staticmethod
    def slots(*, per_key: int, per_tenant: int, per_address: int, unverified: int, total: int) -> RequestSlots:
        return RequestSlots(
            limits={
                RequestCaps.PER_KEY: per_key,
                RequestCaps.PER_TENANT: per_tenant,
                RequestCaps.PER_ADDRESS: per_address,
                RequestCaps.UNVERIFIED: unverified,
                RequestCaps.TOTAL: total,
            }
        )


def claim_of(key: VerifiedKey | None, *, address: str) -> Claim:
    """What one request counts against: its key, tenant and the process; or, unverified, its
    client address, the unverified share and the process."""
    if key is not None:
        return (
            (RequestCaps.PER_KEY, key.key_id),
            (RequestCaps.PER_TENANT, key.tenant_id),
            (RequestCaps.TOTAL, ""),
        )
    return ((RequestCaps.PER_ADDRESS, address), (RequestCaps.UNVERIFIED, ""), (RequestCaps.TOTAL, ""))


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else UNKNOWN_ADDRESS


class _HeldSlot:
    """One request's slots; ``release`` may be called from every way the request ends, only the
    first counts."""

    def __init__(self, slots: RequestSlots, claim: Claim) -> None:
        self._slots = slots
        self._claim = claim
        self._lock = threading.Lock()
        self._released = False

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._slots.release(self._claim)


def release_request_slot(scope: Scope) -> None:
    """Give the request's slots back early (an event stream that starts streaming); a no-op for
    requests the cap does not count."""
    held = scope.get(SLOT_KEY)
    if isinstance(held, _HeldSlot):
        held.release()


def verified_key_of(scope: Scope) -> VerifiedKey | None:
    """The request's verified key as the cap saw it (None: anonymous, unknown or revoked key)."""
    key = scope.get(VERIFIED_KEY)
    return key if isinstance(key, VerifiedKey) else None


def known_unverified(scope: Scope) -> bool:
    """True when the cap saw the request and found no active key behind it; False when it found
    one, or never saw the request (an app without the middleware)."""
    return VERIFIED_KEY in scope and scope[VERIFIED_KEY] is None


class RequestCapMiddleware:
    """Pure ASGI middleware (no body buffering, streaming untouched)."""

    def __init__(self, app: ASGIApp, *, slots: RequestSlots, known_keys: KnownKeys, presented: PrincipalOf) -> None:
        self.app = app
        self.slots = slots
        self.known_keys = known_keys
        self.presented = presented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in EXEMPT_PATHS:
            await self.app(scope, receive, send)
            return
        try:
            key, held = await self._take(scope)
        except SlotsFull as exc:
            await self._refuse(exc, scope, receive, send)
            return
        scope[VERIFIED_KEY] = key
        scope[SLOT_KEY] = held

        async def send_releasing(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                held.release()  # before the client can read the answer and send its next request
            await send(message)

        try:
            await self.app(scope, receive, send_releasing)
        finally:
            held.release()

    async def _take(self, scope: Scope) -> tuple[VerifiedKey | None, _HeldSlot]:
        """The request's verified key (if any) and its slots, or SlotsFull."""
        key = await self._verified(self.presented(scope))
        claim = claim_of(key, address=_address(scope))
        self.slots.acquire(claim)
        return key, _HeldSlot(self.slots, claim)

    async def _verified(self, digest: str | None) -> VerifiedKey | None:
        """The active key behind the presented digest, from memory or the database.

        Looked up before any slot is taken, so that a key's owner is counted as itself from its
        first request: were the lookup made under the client address's slot, a flood of random
        keys from the same address (a shared NAT, a proxy that hides addresses) would keep every
        key not yet remembered out. Lookups wait on the event loop for one of a few threads of
        their own, so a burst of unknown keys costs them time, not the routes' threads."""
        if digest is None:
            return None
        key = self.known_keys.cached(digest)
        if key is not None:
            return key
        try:
            return await self.known_keys.verify(digest)
        except SQLAlchemyError as exc:  # the database is down: count it as unverified; the route answers the outage
            log.warning("could not verify an API key for the request cap: %s", type(exc).__name__)
            return None

    @staticmethod
    async def _refuse(exc: SlotsFull, scope: Scope, receive: Receive, send: Send) -> None:
        problem = slots_full_problem(
            exc,
            slug="too-many-concurrent-requests",
            summary="too many requests in flight",
            advice=f"wait for an answer before sending more, or retry in {RETRY_AFTER_S} s",
            retry_after_s=RETRY_AFTER_S,
        )
        await problem_response(problem)(scope, receive, send)
