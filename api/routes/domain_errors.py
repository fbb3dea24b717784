"""Domain errors as RFC 9457 problems: the one place their HTTP status is decided.

Below the routes, code raises :class:`kernel.errors.DomainError` subclasses carrying a slug, a
detail and extra members as plain data; this module gives each kind its status and renders it
exactly as a :class:`api.problems.Problem` with the same members would be (same type, title,
status, detail, extra members and Retry-After).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from api.problems import Problem, problem_response
from kernel.errors import Conflict, DomainError, Forbidden, InvalidInput, LimitReached, NotFound, TooLarge, Unavailable

__all__ = ["install_domain_error_handler", "problem_for"]

E = TypeVar("E", bound=type[DomainError])

HTTP_STATUS: Final[dict[type[DomainError], int]] = {}
"""Each kind of domain error and its status; an error takes its nearest registered base's."""


def answers(status: int) -> Callable[[E], E]:
    """Register the HTTP status a kind of domain error (and its subclasses) answers with."""

    def register(kind: E) -> E:
        HTTP_STATUS[kind] = status
        return kind

    return register


answers(422)(InvalidInput)
answers(404)(NotFound)
answers(403)(Forbidden)
answers(409)(Conflict)
answers(413)(TooLarge)
answers(429)(LimitReached)
answers(503)(Unavailable)


def _status_of(error: DomainError) -> int:
    for kind in type(error).__mro__:
        if kind in HTTP_STATUS:
            return HTTP_STATUS[kind]
    raise LookupError(f"no HTTP status registered for {type(error).__name__}")


def problem_for(error: DomainError) -> Problem:
    """The problem a domain error answers as."""
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else None
    return Problem(status=_status_of(error), slug=error.slug, detail=error.detail, extra=error.extra, headers=headers)


def install_domain_error_handler(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _domain_error(request: Request, exc: DomainError) -> JSONResponse:
        return problem_response(problem_for(exc), request)
