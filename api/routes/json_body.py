"""Request bodies parsed as JSON within bounds: no body nests past 64 levels or holds a number
literal of more than 100 characters.

Why: FastAPI parses a JSON body with plain ``json.loads``. A body nested a few hundred levels
deep parses, then fails wherever it is walked again (POST /v1/jobs answered 500: pydantic's
"Maximum serialization depth exceeded"); a 5,000-digit integer is a bare ``ValueError`` (a
generic 400). Every JSON body is scanned first (kernel/bounded_json.py) and refused like malformed
JSON: a 422 ``validation-error`` saying what and where (line, column, character), never the value.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from kernel.bounded_json import JsonBounds, JsonRefused, check_bounds

__all__ = ["BODY_BOUNDS", "BoundedJsonRequest", "BoundedJsonRoute"]

BODY_BOUNDS = JsonBounds(max_chars=sys.maxsize, max_depth=64, max_number_chars=100, allow_non_finite=True)
"""A job or tuning spec nests 5 or 6 levels. The size is bounded by the server, NaN and Infinity
by each field's own validation (as before), so neither is refused here."""

_WORDS = {
    "too-deep": f"arrays and objects nested more than {BODY_BOUNDS.max_depth} levels deep",
    "number-too-long": f"a number of more than {BODY_BOUNDS.max_number_chars} characters",
}


class BoundedJsonRequest(Request):
    """A request whose ``json()`` refuses a body beyond BODY_BOUNDS before parsing it."""

    async def json(self) -> Any:
        body = await self.body()
        try:
            text = body.decode(json.detect_encoding(body))
        except UnicodeDecodeError:
            text = None  # json.loads refuses it below, as it always did
        if text is not None:
            try:
                check_bounds(text, BODY_BOUNDS)
            except JsonRefused as refused:
                # FastAPI answers a JSONDecodeError with a json_invalid validation error, which the
                # problem handler words with its line and column (api/json_errors.py).
                words = _WORDS.get(refused.reason, refused.detail)
                raise json.JSONDecodeError(words, text, refused.position or 0) from None
        return await super().json()


class BoundedJsonRoute(APIRoute):
    """An APIRoute whose endpoints see a :class:`BoundedJsonRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(BoundedJsonRequest(request.scope, request.receive))

        return bounded
