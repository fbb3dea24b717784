"""Storing a text dataset's token ids as a content-addressed, memory-mappable ``.npy`` blob.

The ids are written chunk by chunk as the texts are tokenised (kernel.ingest.text), straight into
the pending blob, so the API never holds the whole (n, max_length) array.
"""

from __future__ import annotations

from collections.abc import Callable

from kernel.datasets.image_arrays import StagedArray
from kernel.storage.blobs import BlobStore, PendingBlob


def stage_token_array(blobs: BlobStore, write: Callable[[PendingBlob], object]) -> StagedArray:
    """Run ``write`` into a pending blob and adopt the result at its content address."""
    pending = blobs.begin()
    try:
        write(pending)
        sha256 = pending.finish()
        key, created = blobs.adopt(pending.path, sha256, keep_pending=True)
    except BaseException:
        pending.discard()
        raise
    return StagedArray(key=key, sha256=sha256, created=created, pending=pending)
