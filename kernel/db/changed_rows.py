"""How many rows a bulk UPDATE or DELETE changed, under the type SQLAlchemy's Session hides.

``Session.execute`` is typed to return ``Result``, which has no ``rowcount``; for an UPDATE or
DELETE without RETURNING it returns a ``CursorResult`` at runtime, which has one.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Delete, Update
from sqlalchemy.orm import Session


def changed_rows(session: Session, statement: Update | Delete) -> int:
    """Execute ``statement`` in ``session`` and return the number of rows it matched."""
    result = cast("CursorResult[Any]", session.execute(statement))
    return result.rowcount
