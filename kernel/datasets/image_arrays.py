"""Storing an image dataset's decoded uint8 array as a content-addressed .npy blob.

The worker trains on this array, memory-mapped (``np.load(..., mmap_mode="r")``), so images
are decoded once, at upload, by the API's limits; the uploaded file stays stored as it was sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kernel.storage.blobs import BlobStore, PendingBlob


@dataclass(frozen=True)
class StagedArray:
    """The array's blob (key, and whether this upload created it) and the pending copy kept until
    the dataset row commits, to restore the blob should a concurrent failed upload remove it."""

    key: str
    sha256: str
    created: bool
    pending: PendingBlob


def stage_image_array(blobs: BlobStore, images: np.ndarray) -> StagedArray:
    """Write ``images`` as a .npy file (never pickled) and adopt it at its content address."""
    pending = blobs.begin()
    try:
        np.lib.format.write_array(pending, np.ascontiguousarray(images), allow_pickle=False)
        sha256 = pending.finish()
        key, created = blobs.adopt(pending.path, sha256, keep_pending=True)
    except BaseException:
        pending.discard()
        raise
    return StagedArray(key=key, sha256=sha256, created=created, pending=pending)
