"""Per-API-key request rate limits: a token bucket per key, answered with a 429 problem.

Why in the API process and not a proxy: the limit is per API key, which only the service can
identify, and it must answer with the same RFC 9457 problem format as every other error. Keys
are identified by a digest (never the key itself) and the table is bounded (least recently
used keys are forgotten first), so an attacker cycling random keys cannot grow it without
bound. The principal is the API key whatever carries it: a Bearer header and a dashboard session
cookie (which names the key's digest, signed, next to its session token) draw on one bucket, so
the cookie is no way around the limit; reading it costs an HMAC, no database lookup. Limits are
per API process; with several processes behind a balancer the effective limit is the sum —
documented, and conservative enough for the purpose (protecting the service).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from api.problems import Problem, problem_response
from api.routes.ui_session import COOKIE_NAME, SessionCookie, decode_cookie
from kernel.access.keys import key_digest

__all__ = ["PrincipalOf", "RateLimitMiddleware", "RateLimiter", "bearer_principal", "principal_resolver"]

PrincipalOf = Callable[[Scope], "str | None"]
"""The API key digest a request acts as, or None for an anonymous request (not limited)."""

EXEMPT_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Token buckets: `burst` requests at once, refilled at `per_minute`/60 per second."""

    def __init__(
        self,
        *,
        per_minute: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
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


def _header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())  # ASGI: (name, value) byte pairs
    for header, value in headers:
        if header == name:
            return value.decode("latin-1")
    return None


def bearer_principal(scope: Scope) -> str | None:
    """The digest of the Bearer key, as the database stores it (``kernel.access.keys.key_digest``)."""
    scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return key_digest(token.strip())
    return None


def principal_resolver(*, secret: Callable[[], bytes], max_age_s: float) -> PrincipalOf:
    """Bearer first (as the dashboard authenticates), else a validly signed session cookie's
    key digest: the same string for the same key, so both share one bucket. A forged or expired
    cookie, or one from before login, names no principal. A signed cookie whose session has
    ended still counts against its key (it was that key's), so replaying it is no way around
    the limit either; it authenticates nothing (the dashboard looks the session up)."""

    def principal(scope: Scope) -> str | None:
        bearer = bearer_principal(scope)
        if bearer is not None:
            return bearer
        cookie = cookie_parser(_header(scope, b"cookie") or "").get(COOKIE_NAME)
        if not cookie:
            return None
        decoded = decode_cookie(cookie, secret(), max_age_s=max_age_s)
        return decoded.key_digest if isinstance(decoded, SessionCookie) else None

    return principal


class RateLimitMiddleware:
    """Pure ASGI middleware (no body buffering, streaming untouched)."""

    def __init__(self, app: ASGIApp, *, limiter: RateLimiter, principal: PrincipalOf = bearer_principal) -> None:
        self.app = app
        self.limiter = limiter
        self.principal = principal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in EXEMPT_PATHS:
            key_id = self.principal(scope)
            wait = self.limiter.acquire(key_id) if key_id is not None else None
            if wait is not None:
                retry_after = max(1, math.ceil(wait))
                problem = Problem(
                    status=429,
                    slug="rate-limited",
                    detail=f"too many requests for this API key; retry in {retry_after} s",
                    headers={"Retry-After": str(retry_after)},
                    extra={"retry_after_s": retry_after},
                )
                response = problem_response(problem)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
