"""When to retry a request and how long to wait first.

A request is retried only when repeating it cannot do harm: reads, the estimate dry run, and job
submissions (they carry an Idempotency-Key, so the server replays the first admission instead of
reserving budget twice). Other writes (dataset upload, budget raise, cancel) are retried only
when the server certainly did not act on them: the connection was never made, or it answered
429. A 502/504 after an upload may mean the dataset was registered, so it is not sent again.
"""

from __future__ import annotations

import datetime as dt
import email.utils
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})
NOT_PROCESSED_STATUSES = frozenset({429})
NOT_SENT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)


@dataclass(frozen=True)
class RetryNotice:
    """Told to ``Client(on_retry=...)`` before each wait, e.g. for the CLI to say why it pauses."""

    method: str
    path: str
    attempt: int  # 1 for the first retry
    delay: float
    reason: str  # "HTTP 503" or the transport error's class name


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    backoff_base: float = 0.5  # seconds before the first retry; doubles each time
    backoff_max: float = 30.0
    retry_after_max: float = 60.0  # a longer Retry-After is not waited for: the error is raised

    def backoff(self, attempt: int) -> float:
        """Exponential backoff for retry number ``attempt`` (0-based)."""
        return min(self.backoff_max, self.backoff_base * (2.0**attempt))

    def should_retry_status(self, status: int, *, replay_safe: bool) -> bool:
        return status in (RETRY_STATUSES if replay_safe else NOT_PROCESSED_STATUSES)

    def should_retry_error(self, error: Exception, *, replay_safe: bool) -> bool:
        if replay_safe:
            return isinstance(error, httpx.TransportError)
        return isinstance(error, NOT_SENT_ERRORS)

    def delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        """The server's Retry-After when it gives one, else exponential backoff; None when the
        server asks for a longer wait than ``retry_after_max`` (better to tell the caller now)."""
        if response is not None:
            after = parse_retry_after(response.headers.get("retry-after"))
            if after is not None:
                return after if after <= self.retry_after_max else None
        return self.backoff(attempt)


def parse_retry_after(value: str | None, *, now: dt.datetime | None = None) -> float | None:
    """Retry-After is either delta-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    now = now or dt.datetime.now(dt.UTC)
    return max(0.0, (when - now).total_seconds())
