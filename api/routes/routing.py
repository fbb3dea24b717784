"""Routes that hand their database connection back the moment the endpoint returns.

Why: a request's read session (``SessionDep``) is closed by the dependency's teardown, which
FastAPI runs in another worker-thread hop after the endpoint. Under load (hundreds of concurrent
requests, 40 worker threads) a request can hold its pooled connection while it waits for that
hop, the pool runs dry, and requests time out on checkout although the database is idle — the
load run (bench/load_run.py) saw exactly that. Ending the session's transaction in the same
thread, right after the endpoint, releases the connection at once; the session stays usable
(``expire_on_commit=False``), so responses built from loaded objects are unaffected.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from api.routes.json_body import BoundedJsonRoute

__all__ = ["ReleasingRoute", "release_sessions_after"]


def _release(sessions: list[Session], *, failed: bool) -> None:
    for session in sessions:
        if session.in_transaction():
            if failed:
                session.rollback()
            else:
                session.commit()


def release_sessions_after(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a sync endpoint so every Session argument releases its connection on return."""
    if inspect.iscoroutinefunction(endpoint) or getattr(endpoint, "__releases_sessions__", False):
        return endpoint

    @functools.wraps(endpoint)
    def wrapper(*args: Any, **named: Any) -> Any:
        sessions = [value for value in (*args, *named.values()) if isinstance(value, Session)]
        try:
            result = endpoint(*args, **named)
        except BaseException:
            _release(sessions, failed=True)
            raise
        _release(sessions, failed=False)
        return result

    # FastAPI reads the signature (and resolves string annotations with the function's globals):
    # give it the endpoint's, already evaluated in the endpoint's own module.
    wrapper.__signature__ = inspect.signature(endpoint, eval_str=True)  # type: ignore[attr-defined]
    wrapper.__releases_sessions__ = True  # type: ignore[attr-defined]
    return wrapper


class ReleasingRoute(BoundedJsonRoute):
    """An APIRoute whose sync endpoint releases its sessions' connections when it returns (and
    whose JSON body is parsed within bounds: api/routes/json_body.py)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        super().__init__(path, release_sessions_after(endpoint), **options)
