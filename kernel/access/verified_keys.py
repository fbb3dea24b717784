"""Which key and tenant a presented key digest belongs to, checked against the database and
remembered for a while: what the per-principal request cap (:mod:`api.limits.request_cap`) counts on.

Why verified, not merely presented: a cap keyed on whatever key a request presents would give an
attacker a fresh cap with every random key, and a cap per tenant needs the key's tenant, which
only the database knows. A digest is remembered only after the database said it names an active
key, so nothing an attacker sends can put a digest in the table: random keys are never
remembered and never evict a real one from a short list.

This is accounting, not authentication: the routes still authenticate every request
themselves. A key revoked while remembered is still counted as its tenant's for at most
``ttl_s`` (and answered 401 by the routes), which changes nothing but whose slot it takes.

Lookups run in worker threads under a capacity limiter of their own, never under the limiter
that Starlette's sync routes share, so a burst of unknown keys cannot take those threads.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread
from anyio import CapacityLimiter
from sqlalchemy import select

from kernel.db.engine import Database
from kernel.db.orm import ApiKey

__all__ = ["KnownKeys", "VerifiedKey", "lookup_active_key"]

LOOKUP_THREADS = 4
"""Key lookups running at once (each one indexed query); more wait on the event loop."""


@dataclass(frozen=True)
class VerifiedKey:
    """An active API key: its id and its tenant's id (never the key or its digest)."""

    key_id: str
    tenant_id: str


def lookup_active_key(db: Database, digest: str) -> VerifiedKey | None:
    """The active (not revoked) key with this SHA-256 digest, or None."""
    with db.read_session() as session:
        row = session.execute(
            select(ApiKey.id, ApiKey.tenant_id).where(ApiKey.digest == digest, ApiKey.revoked_at.is_(None))
        ).first()
    return VerifiedKey(key_id=row.id, tenant_id=row.tenant_id) if row is not None else None


@dataclass
class _Known:
    key: VerifiedKey
    expires: float


class KnownKeys:
    """Digests of active keys, looked up once and remembered for ``ttl_s`` (least recently used
    forgotten first beyond ``max_keys``)."""

    def __init__(
        self,
        *,
        lookup: Callable[[str], VerifiedKey | None],
        ttl_s: float = 300.0,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0 or max_keys < 1:
            raise ValueError("ttl_s must be > 0 and max_keys >= 1")
        self._lookup = lookup
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._clock = clock
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._limiter: CapacityLimiter | None = None

    def cached(self, digest: str) -> VerifiedKey | None:
        """The remembered key for ``digest``, if it was verified less than ``ttl_s`` ago."""
        known = self._known.get(digest)
        if known is None:
            return None
        if known.expires <= self._clock():
            self._known.pop(digest, None)
            return None
        self._known.move_to_end(digest)
        return known.key

    async def verify(self, digest: str) -> VerifiedKey | None:
        """Look the digest up (in a lookup thread) and remember it if it names an active key."""
        if self._limiter is None:  # made on first use, inside the serving event loop
            self._limiter = CapacityLimiter(LOOKUP_THREADS)
        found = await anyio.to_thread.run_sync(self._lookup, digest, limiter=self._limiter)
        if found is not None:
            self.remember(digest, found)
        return found

    def remember(self, digest: str, key: VerifiedKey) -> None:
        self._known.pop(digest, None)
        self._known[digest] = _Known(key=key, expires=self._clock() + self.ttl_s)
        while len(self._known) > self.max_keys:
            self._known.popitem(last=False)

    def __len__(self) -> int:
        return len(self._known)
