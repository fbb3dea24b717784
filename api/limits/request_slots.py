"""Requests in flight, counted along several scopes at once: per API key, per tenant, per client
address, for unverified requests together, and for the whole process.

Why several scopes in one registry: one request counts against its key, its tenant and the total
at the same time, and must get all three slots or none; one lock makes that atomic, so a cap is
never exceeded and never undercounted however requests interleave. Like the other capped slots
(:mod:`api.limits.capped_slots`) nothing ever waits for a slot: a full scope is refused at once, and the
caller answers 429.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from api.limits.capped_slots import SlotsFull

__all__ = ["Claim", "RequestSlots"]

Claim = tuple[tuple[str, str], ...]
"""The (scope, owner) pairs one request counts against, checked in this order, e.g.
``(("per-key", key_id), ("per-tenant", tenant_id), ("total", ""))``."""


class RequestSlots:
    """Counting semaphores keyed by (scope, owner), each scope with its limit, never waited on."""

    def __init__(self, *, limits: Mapping[str, int], what: str = "requests") -> None:
        if any(limit < 1 for limit in limits.values()):
            raise ValueError("every limit must be at least 1")
        self.limits = dict(limits)
        self.what = what
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], int] = {}

    def acquire(self, claim: Claim) -> None:
        """Take a slot in every scope of ``claim``, or none and raise SlotsFull naming the first
        full scope. Every acquire must be paired with one release of the same claim."""
        self._check_known(claim)
        with self._lock:
            for scope, owner in claim:
                limit = self.limits[scope]
                if self._held.get((scope, owner), 0) >= limit:
                    raise SlotsFull(scope=scope, limit=limit, what=self.what)
            for slot in claim:
                self._held[slot] = self._held.get(slot, 0) + 1

    def release(self, claim: Claim) -> None:
        with self._lock:
            if any(self._held.get(slot, 0) < 1 for slot in claim):
                raise RuntimeError(f"{self.what} slot released more often than acquired")
            for slot in claim:
                held = self._held[slot]
                if held == 1:
                    del self._held[slot]  # so owners that come and go leave nothing behind
                else:
                    self._held[slot] = held - 1

    def in_flight(self, scope: str, owner: str = "") -> int:
        with self._lock:
            return self._held.get((scope, owner), 0)

    def owners(self) -> int:
        """How many (scope, owner) counters are live: zero once every request has ended."""
        with self._lock:
            return len(self._held)

    def _check_known(self, claim: Sequence[tuple[str, str]]) -> None:
        unknown = {scope for scope, _owner in claim} - self.limits.keys()
        if unknown:
            raise ValueError(f"no limit for {sorted(unknown)}")
