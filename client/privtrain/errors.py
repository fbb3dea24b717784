"""Exceptions for API problems (RFC 9457) and client-side failures.

The server gives every error a stable ``type`` (``/problems/<slug>``). Each exception class
registers the slugs it stands for, so callers can ``except BudgetExceeded`` instead of parsing
prose, and a new slug is one decorator argument rather than another branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

PROBLEM_PREFIX = "/problems/"

_BY_SLUG: dict[str, type[PrivtrainError]] = {}
_BY_STATUS: dict[int, type[PrivtrainError]] = {}

E = TypeVar("E", bound="type[PrivtrainError]")


def problem_types(*slugs: str, statuses: tuple[int, ...] = ()) -> Callable[[E], E]:
    """Class decorator: map problem slugs (and, for non-problem bodies, HTTP statuses) to a class."""

    def register(cls: E) -> E:
        for slug in slugs:
            _BY_SLUG[slug] = cls
        for status in statuses:
            _BY_STATUS[status] = cls
        return cls

    return register


class PrivtrainError(Exception):
    """Any failure reported by the privtrain client; API problems carry their RFC 9457 fields."""

    def __init__(
        self,
        *,
        title: str,
        detail: str,
        status: int | None = None,
        type: str | None = None,
        problem: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{title}: {detail}" if detail else title)
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.problem: dict[str, Any] = dict(problem or {})

    @property
    def slug(self) -> str | None:
        """The stable part of ``type`` (``insufficient-privacy-budget``), or None."""
        if self.type and self.type.startswith(PROBLEM_PREFIX):
            return self.type[len(PROBLEM_PREFIX) :]
        return self.type

    @property
    def extra(self) -> dict[str, Any]:
        """Problem members beyond the standard five (e.g. ``remaining_epsilon``, ``errors``)."""
        standard = {"type", "title", "status", "detail", "instance"}
        return {k: v for k, v in self.problem.items() if k not in standard}


@problem_types(
    "validation-error",
    "invalid-job-spec",
    "unknown-algorithm",
    "unknown-model",
    "model-incompatible",
    "invalid-dataset",
    "invalid-dataset-name",
    "invalid-budget",
    "invalid-cursor",
    "calibration-failed",
    statuses=(400, 422),
)
class InvalidRequest(PrivtrainError):
    """The request was understood but rejected (bad spec, bad dataset, bad budget)."""


@problem_types("idempotency-key-reused")
class IdempotencyKeyReused(InvalidRequest):
    """An Idempotency-Key was sent again with a different body."""


@problem_types("payload-too-large", "parse-deadline-exceeded", statuses=(413,))
class PayloadTooLarge(InvalidRequest):
    """The upload exceeds the server's size limit, or took longer to parse than it allows."""


@problem_types("unauthorized", "forbidden", statuses=(401, 403))
class Unauthorized(PrivtrainError):
    """Missing, malformed, invalid or revoked API key."""


@problem_types("not-found", statuses=(404,))
class NotFound(PrivtrainError):
    """The object does not exist or belongs to another tenant (the API does not say which)."""


@problem_types(
    "job-not-cancellable",
    "job-not-succeeded",
    "dataset-deleted",
    "deleted-content-was-private",
    "privacy-unit-differs",
    statuses=(409,),
)
class Conflict(PrivtrainError):
    """The object is in a state that does not allow the call (e.g. artifacts of a running job)."""


@problem_types("insufficient-privacy-budget")
class BudgetExceeded(Conflict):
    """The job does not fit the dataset's remaining privacy budget; nothing was stored."""

    @property
    def remaining_epsilon(self) -> float | None:
        value = self.problem.get("remaining_epsilon")
        return float(value) if value is not None else None

    @property
    def largest_admissible_epsilon(self) -> float | None:
        """The largest target ε a job of this shape would be admitted at now (None from older servers)."""
        value = self.problem.get("largest_admissible_epsilon")
        return float(value) if value is not None else None


@problem_types("dataset-already-registered")
class AlreadyRegistered(Conflict):
    """These rows are already a dataset of this tenant: raise that dataset's budget, or delete it
    and upload again (its ledger continues)."""

    @property
    def existing_dataset_id(self) -> str | None:
        value = self.problem.get("existing_dataset_id")
        return str(value) if value is not None else None


@problem_types("model-deleted", statuses=(410,))
class Gone(PrivtrainError):
    """The object was erased at its owner's request (a model deleted with its dataset)."""


@problem_types(
    "rate-limited", "too-many-active-jobs", "too-many-uploads", "too-many-concurrent-requests", statuses=(429,)
)
class RateLimited(PrivtrainError):
    """Too many requests (or active jobs, concurrent uploads, requests in flight), still refused
    after the client's retries."""


@problem_types("internal-error", statuses=(500, 502, 503, 504))
class ServerError(PrivtrainError):
    """The server (or a proxy in front of it) failed."""


class TransportError(PrivtrainError):
    """The server could not be reached (connection refused, timeout), even after retries."""


class WaitTimeout(PrivtrainError):
    """``Client.wait`` gave up before the job reached a terminal state."""


class IntegrityError(PrivtrainError):
    """A downloaded artifact does not match the digest the server announced."""


def error_for(status: int, body: Any) -> PrivtrainError:
    """Build the exception for an error response: by problem ``type`` first, then by status."""
    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    type_ = problem.get("type") if isinstance(problem.get("type"), str) else None
    slug = type_[len(PROBLEM_PREFIX) :] if type_ and type_.startswith(PROBLEM_PREFIX) else None
    fallback = ServerError if status >= 500 else PrivtrainError
    cls = _BY_SLUG.get(slug or "") or _BY_STATUS.get(status, fallback)
    title = str(problem.get("title") or f"HTTP {status}")
    detail = problem.get("detail")
    if not isinstance(detail, str):
        detail = body.strip()[:500] if isinstance(body, str) else ""
    return cls(title=title, detail=detail, status=status, type=type_, problem=problem)


def registered_problem_types() -> dict[str, type[PrivtrainError]]:
    """The slug → exception mapping (a copy), for documentation and tests."""
    return dict(_BY_SLUG)
