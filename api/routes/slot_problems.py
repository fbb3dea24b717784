"""What the capped-slot registries (uploads, event streams, pricing) share at the API edge: one
registry per app, made on first use, and the 429 problem a full registry answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import FastAPI

from api.limits.capped_slots import SlotsFull
from api.problems import Problem

__all__ = ["app_registry", "slots_full_problem"]

R = TypeVar("R")


def app_registry(app: FastAPI, *, attribute: str, make: Callable[[], R]) -> R:
    """``app.state.<attribute>``, made on first use (each app, and so each test client, has its own)."""
    registry = getattr(app.state, attribute, None)
    if registry is None:
        registry = make()
        setattr(app.state, attribute, registry)
    return registry


def slots_full_problem(exc: SlotsFull, *, slug: str, summary: str, advice: str, retry_after_s: int) -> Problem:
    """429 with ``Retry-After``, naming the cap that was reached (per owner or total) and its limit."""
    return Problem(
        status=429,
        slug=slug,
        detail=f"{summary} ({exc.scope} limit {exc.limit}); {advice}",
        headers={"Retry-After": str(retry_after_s)},
        extra={"limit": exc.limit, "scope": exc.scope},
    )
