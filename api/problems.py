"""RFC 9457 problem details with a stable ``type`` per error.

Every error the API returns goes through :class:`Problem`, so clients can switch on ``type``
(``/problems/<slug>``) and never need to parse prose. Routes raise problems; code below them
raises :mod:`kernel.errors` domain errors, which ``api.routes.domain_errors`` turns into problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from sqlalchemy.exc import InterfaceError as SQLAlchemyInterfaceError
from sqlalchemy.exc import OperationalError as SQLAlchemyOperationalError
from sqlalchemy.exc import TimeoutError as SQLAlchemyPoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import json_errors
from kernel import suggestions
from kernel.storage.blobs import StorageUnavailable

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "/problems/"


class Problem(Exception):
    """An HTTP error with a stable slug; raise it in the API layer (api/routes/)."""

    def __init__(
        self,
        *,
        status: int,
        slug: str,
        detail: str,
        title: str | None = None,
        extra: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.title = title or HTTPStatus(status).phrase
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def body(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extra)
        return body


def problem_response(problem: Problem, request: Request | None = None) -> JSONResponse:
    instance = request.url.path if request is not None else None
    return JSONResponse(
        problem.body(instance),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=problem.headers,
    )


def not_found(what: str) -> Problem:
    """404 for anything missing or belonging to another tenant (never reveal existence)."""
    return Problem(status=404, slug="not-found", detail=f"{what} not found")


_HTTP_SLUGS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    413: "payload-too-large",
    415: "unsupported-media-type",
}


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model the route reads its JSON body into, if it has one."""
    body_field = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body_field, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _message(error: Mapping[str, Any], body_model: type[BaseModel] | None) -> str:
    """pydantic's message, but an unknown field says so and names the field meant (if close)."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and body_model is not None and loc[:1] == ("body",):
        hint = suggestions.extra_field_hint(model=body_model, loc=loc[1:])
        return f"unknown field; {hint}" if hint else "unknown field"
    return str(error.get("msg", ""))


def _is_typo(error: Mapping[str, Any], body_model: type[BaseModel] | None) -> bool:
    """An unknown body field close to a field that is accepted there."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") != "extra_forbidden" or body_model is None or len(loc) < 2 or loc[0] != "body":
        return False
    return bool(suggestions.close_matches(str(loc[-1]), suggestions.fields_at(body_model, loc[1:-1]) or []))


def _clean_validation_errors(
    exc: RequestValidationError, *, body_model: type[BaseModel] | None = None
) -> list[dict[str, Any]]:
    """Location and message only: the offending input is not echoed back (it may be large)."""
    cleaned = []
    for error in exc.errors():
        cleaned.append(
            {
                "loc": [str(part) for part in error.get("loc", ())],
                "msg": _message(error, body_model),
                "type": str(error.get("type", "")),
            }
        )
    return cleaned


def _validation_problem(request: Request, exc: RequestValidationError) -> Problem:
    """422 ``validation-error``; a body that is not JSON at all says where it stops being JSON."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        position = json_errors.describe(body=exc.body, error=errors[0], fallback=str(errors[0].get("msg", "")))
        return Problem(
            status=422,
            slug="validation-error",
            detail=f"the request body is not valid JSON: {position.text}",
            extra={"errors": _clean_validation_errors(exc), **position.members()},
        )
    body_model = _body_model(request)
    cleaned = _clean_validation_errors(exc, body_model=body_model)
    # A misspelt field also makes the field meant "missing"; the spelling is the one to report.
    typos = [clean for clean, error in zip(cleaned, errors, strict=True) if _is_typo(error, body_model)]
    first = (typos or cleaned or [{"loc": [], "msg": "invalid request"}])[0]
    detail = f"{'.'.join(first['loc'])}: {first['msg']}" if first["loc"] else first["msg"]
    return Problem(status=422, slug="validation-error", detail=detail, extra={"errors": cleaned})


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(_validation_problem(request, exc), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = _HTTP_SLUGS.get(exc.status_code, "http-error")
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        problem = Problem(status=exc.status_code, slug=slug, detail=detail, headers=dict(exc.headers or {}))
        return problem_response(problem, request)

    @app.exception_handler(SQLAlchemyOperationalError)
    @app.exception_handler(SQLAlchemyInterfaceError)
    @app.exception_handler(SQLAlchemyPoolTimeout)
    async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
        import logging

        logging.getLogger("privtrain.api").warning(
            "database unavailable", extra={"path": request.url.path, "error": type(exc).__name__}
        )
        problem = Problem(
            status=503,
            slug="database-unavailable",
            detail="the database is unreachable; retry shortly (GET /readyz shows what is down)",
            headers={"Retry-After": "5"},
        )
        return problem_response(problem, request)

    @app.exception_handler(StorageUnavailable)
    async def _storage_unavailable(request: Request, exc: StorageUnavailable) -> JSONResponse:
        import logging

        logging.getLogger("privtrain.api").warning(
            "blob store unavailable", extra={"path": request.url.path, "error": type(exc.__cause__).__name__}
        )
        problem = Problem(
            status=503,
            slug="storage-unavailable",
            detail="the object store is unreachable or refused the operation; nothing was stored or lost, "
            "retry shortly",
            headers={"Retry-After": "5"},
        )
        return problem_response(problem, request)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        import logging

        logging.getLogger("privtrain.api").exception("unhandled error", extra={"path": request.url.path})
        problem = Problem(status=500, slug="internal-error", detail="internal server error")
        return problem_response(problem, request)


class ProblemDetails(BaseModel):
    """The body of every error response (RFC 9457); extra members carry machine-readable detail."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None


def document_problems(app: FastAPI) -> None:
    """Make the OpenAPI schema say what the API really sends for errors.

    FastAPI documents a 422 as application/json HTTPValidationError; every error here is an
    application/problem+json :class:`ProblemDetails`. The generated schema is rewritten once:
    every documented 4xx/5xx gets the problem content, and every operation gets a ``default``
    problem response, so clients and schema-driven tests (schemathesis) see the truth.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components["ProblemDetails"] = ProblemDetails.model_json_schema(ref_template="#/components/schemas/{model}")
        content = {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}}
        for path_item in schema.get("paths", {}).values():
            for operation in path_item.values():
                responses = operation.setdefault("responses", {})
                for code, response in responses.items():
                    if code[:1] in ("4", "5"):
                        response["content"] = content
                        if code == "422":
                            response["description"] = "Invalid request (RFC 9457 problem)"
                responses.setdefault("default", {"description": "An error (RFC 9457 problem)", "content": content})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
