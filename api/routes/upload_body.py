"""Receiving an upload's body into a pending blob: the one place its size and pace are enforced.

Dataset and base-model uploads stream their body to disk on the event loop at a bounded pace
(api.limits.upload_pace); a body that is too large or too slow is refused with the same problem for
both, and its partial blob is discarded whatever happens.
"""

from __future__ import annotations

from fastapi import Request

from api.limits.upload_pace import UploadPace, UploadTooSlow, receive_paced
from api.problems import Problem
from kernel.config import Settings
from kernel.storage.blobs import BlobStore, PendingBlob, UploadTooLarge

__all__ = ["receive_upload_body", "upload_request_body"]


def upload_request_body(*media_types: str, description: str) -> dict[str, object]:
    """The OpenAPI ``requestBody`` of a route that reads its raw body itself (``openapi_extra``): the
    file's bytes, under each media type it takes, so that generated clients can send it."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {
        "requestBody": {"required": True, "description": description, "content": dict.fromkeys(media_types, binary)}
    }


async def receive_upload_body(
    request: Request, *, settings: Settings, blobs: BlobStore, max_bytes: int | None = None
) -> PendingBlob:
    """The whole body in a pending blob (the caller keeps or discards it), or a 413/408 problem.

    ``max_bytes``: a smaller limit than ``max_upload_bytes`` for what this route takes."""
    limit = min(settings.max_upload_bytes, max_bytes) if max_bytes is not None else settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    pace = UploadPace.from_settings(settings)
    pending = blobs.begin(max_bytes=limit)
    try:
        await receive_paced(request.stream(), pending.write, pace=pace)
    except UploadTooLarge as exc:
        pending.discard()
        raise _too_large(limit) from exc
    except UploadTooSlow as exc:
        pending.discard()
        raise _too_slow(exc, pace) from None
    except BaseException:
        pending.discard()
        raise
    return pending


def _too_large(limit: int) -> Problem:
    return Problem(status=413, slug="payload-too-large", detail=f"upload exceeds the limit of {limit} bytes")


def _too_slow(exc: UploadTooSlow, pace: UploadPace) -> Problem:
    why = (
        f"nothing arrived for {pace.idle_timeout_s:g} s"
        if exc.reason == "idle"
        else f"the body arrived slower than {pace.min_rate_bytes_per_s:g} bytes/s on average"
    )
    return Problem(
        status=408,
        slug="upload-too-slow",
        detail=f"upload refused after {exc.received} bytes in {exc.elapsed_s:.1f} s: {why}; nothing was stored",
        extra={"reason": exc.reason},
        headers={"Connection": "close"},
    )
