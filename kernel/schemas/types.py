"""Field types shared by the API's response schemas."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import AfterValidator


def _as_utc(value: dt.datetime) -> dt.datetime:
    """Every timestamp the service stores is UTC; SQLite hands them back naive. Attach UTC so
    responses are RFC 3339 date-times with an offset, as the OpenAPI schema promises."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


UtcDateTime = Annotated[dt.datetime, AfterValidator(_as_utc)]
