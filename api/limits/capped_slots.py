"""Bounded counts of things in flight (uploads, event streams), per owner and in total.

Why refuse instead of queueing: a caller waiting for a slot would hold an open connection (and,
for a sync route, a worker thread) doing nothing; a full registry answers at once so the route
can send 429 with Retry-After. One registry per API process: with several processes behind a
balancer the effective caps are the sums.
"""

from __future__ import annotations

import threading

__all__ = ["CappedSlots", "SlotsFull"]


class SlotsFull(RuntimeError):
    """No slot is free (``scope`` says which cap was reached: the owner's or the total)."""

    def __init__(self, *, scope: str, limit: int, what: str) -> None:
        super().__init__(f"{scope} limit of {limit} concurrent {what} reached")
        self.scope = scope
        self.limit = limit


class CappedSlots:
    """Counting semaphores, one for the process and one per owner, never waited on."""

    def __init__(self, *, total: int, per_owner: int, owner_scope: str, what: str) -> None:
        self.total = total
        self.per_owner = per_owner
        self.owner_scope = owner_scope
        self.what = what
        self._lock = threading.Lock()
        self._in_flight = 0
        self._by_owner: dict[str, int] = {}

    def acquire(self, owner: str) -> None:
        """Take a slot or raise SlotsFull; every acquire must be paired with one release."""
        with self._lock:
            held = self._by_owner.get(owner, 0)
            if held >= self.per_owner:
                raise SlotsFull(scope=self.owner_scope, limit=self.per_owner, what=self.what)
            if self._in_flight >= self.total:
                raise SlotsFull(scope="total", limit=self.total, what=self.what)
            self._by_owner[owner] = held + 1
            self._in_flight += 1

    def release(self, owner: str) -> None:
        with self._lock:
            held = self._by_owner.get(owner, 0)
            if held < 1 or self._in_flight < 1:
                raise RuntimeError(f"{self.what} slot released more often than acquired")
            if held == 1:
                del self._by_owner[owner]
            else:
                self._by_owner[owner] = held - 1
            self._in_flight -= 1

    def in_flight(self, owner: str | None = None) -> int:
        with self._lock:
            return self._in_flight if owner is None else self._by_owner.get(owner, 0)
