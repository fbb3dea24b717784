"""The blob store the settings name: a folder on this host, or an S3-compatible bucket.

Apart from kernel/storage/blobs.py (the interface and the folder store) so that the object store,
which builds on that interface, is not imported by it.
"""

from __future__ import annotations

from pathlib import Path

from kernel.config import Settings
from kernel.storage.blobs import BlobStore

__all__ = ["blob_store_from_settings"]


def blob_store_from_settings(settings: Settings) -> BlobStore:
    """The store ``PRIVTRAIN_STORAGE_URL`` names: a folder (``file://``, default the data dir's
    blobs folder) or an S3-compatible bucket (``s3://bucket/prefix``) with a local cache."""
    url = settings.storage_url
    if url is None:
        return BlobStore(settings.blob_dir, settings.tmp_dir)
    if url.startswith("file://"):
        return BlobStore(Path(url.removeprefix("file://")), settings.tmp_dir)
    # boto3 is heavy (about 0.4 s to import): it loads only where an s3:// store is configured.
    from kernel.storage.s3 import BlobCache, S3BlobStore, S3Location

    cache = BlobCache(settings.blob_cache_dir, max_bytes=settings.blob_cache_max_bytes)
    return S3BlobStore(S3Location.parse(url), tmp_dir=settings.tmp_dir, cache=cache)
