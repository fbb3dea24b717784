"""Per-API-key request rate limits: a token bucket per key, answered with a 429 problem.

Why in the API process and not a proxy: the limit is per API key, which only the service can
identify, and it must answer with the same RFC 9457 problem format as every other error. Keys
are identified by a digest (never the key itself) and the table is bounded (least recently
used keys are forgotten first), so an attacker cycling random keys cannot grow it without
bound. Limits are per API process; with several processes behind a balancer the effective limit
is the sum — documented, and conservative enough for the purpose (protecting the service).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from app.problems import Problem, problem_response

__all__ = ["RateLimitMiddleware", "RateLimiter"]

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets: `burst` requests at once, refilled at `per_minute`/60 per second."""

    def __init__(
        self, *, per_minute: float, burst: int, clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        if per_minute <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("per_minute must be > 0, burst and max_keys >= 1")
        self.rate = per_minute / 60.0
        self.burst = burst
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float | None:
        """Take one token for `key`; None if allowed, else the seconds until one is available."""
        now = self.clock()
        with self._lock:
            bucket = self._buckets.pop(key, None) or _Bucket(tokens=float(self.burst), updated=now)
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            self._buckets[key] = bucket  # most recently used last
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return None
            return (1.0 - bucket.tokens) / self.rate


def _bearer_key_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return hashlib.sha256(token.strip().encode()).hexdigest()[:32]
    return None


class RateLimitMiddleware:
    """Pure ASGI middleware (no body buffering, streaming untouched)."""

    def __init__(self, app: ASGIApp, *, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in EXEMPT_PATHS:
            key_id = _bearer_key_id(scope)
            wait = self.limiter.acquire(key_id) if key_id is not None else None
            if wait is not None:
                retry_after = max(1, math.ceil(wait))
                problem = Problem(
                    status=429, slug="rate-limited",
                    detail=f"too many requests for this API key; retry in {retry_after} s",
                    headers={"Retry-After": str(retry_after)},
                    extra={"retry_after_s": retry_after},
                )
                response = problem_response(problem)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
