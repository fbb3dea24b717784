"""Domain errors: refusals raised below the routes, as plain data.

Why not HTTP problems here: planning, admission, access checks and registration run in the API
and in the worker (which must not load fastapi), and they are domain rules, not HTTP. Each error
carries what the client needs to act on it: a stable ``slug`` (the problem type
``/problems/<slug>``), a human ``detail``, machine-readable ``extra`` members and, for limits,
how long to wait. The API edge (``api.routes.domain_errors``) decides the HTTP status
from the error's class and renders RFC 9457 problem+json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "Conflict",
    "DomainError",
    "FinetuneKOutOfRange",
    "Forbidden",
    "InvalidInput",
    "LimitReached",
    "NotFound",
    "TooLarge",
    "Unavailable",
    "forbidden",
    "not_found",
]


class DomainError(Exception):
    """A refusal with a stable slug; subclasses say which kind (and so which HTTP status)."""

    def __init__(
        self,
        *,
        slug: str,
        detail: str,
        extra: Mapping[str, Any] | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(detail)
        self.slug = slug
        self.detail = detail
        self.extra = dict(extra or {})
        self.retry_after_s = retry_after_s


class InvalidInput(DomainError):
    """The request itself is wrong (a spec, a cursor, a reused idempotency key)."""


class FinetuneKOutOfRange(InvalidInput):
    """``training.finetune_k`` asks for more fine-tuning blocks than the model has.

    Checked at submission from the params alone (the catalogue knows each model's blocks without
    torch), so the job is refused before any budget is reserved instead of failing on the worker."""

    def __init__(self, *, model: str, finetune_k: int, blocks: list[str]) -> None:
        super().__init__(
            slug="finetune-k-out-of-range",
            detail=f"training.finetune_k is {finetune_k}, but model '{model}' with these params has "
            f"{len(blocks)} fine-tuning blocks ({', '.join(blocks)}); choose 1 to {len(blocks)}",
            extra={"finetune_k": finetune_k, "block_count": len(blocks), "blocks": blocks},
        )


class NotFound(DomainError):
    """Missing, or not the caller's to know about (answered alike, so existence never leaks)."""


class Forbidden(DomainError):
    """The caller may see the object but lacks the permission asked for."""


class Conflict(DomainError):
    """The request is valid but the current state refuses it (budget, job already ended)."""


class LimitReached(DomainError):
    """A per-tenant limit is reached; ``retry_after_s`` says when to try again."""


class TooLarge(DomainError):
    """Well-formed, but more than this deployment processes: bytes, or the work parsing it takes."""


class Unavailable(DomainError):
    """This deployment cannot serve the request (a missing component), whatever the input."""


def not_found(what: str) -> NotFound:
    """Anything missing or belonging to another tenant (never reveal existence)."""
    return NotFound(slug="not-found", detail=f"{what} not found")


def forbidden(detail: str) -> Forbidden:
    return Forbidden(slug="forbidden", detail=detail)
