"""Content-addressed blobs in an S3-compatible object store, with a bounded local cache.

Why: with blobs in an object store the API and every worker share nothing but the database, the
broker and the store, so workers can run on any number of hosts. The interface is the filesystem
store's (kernel/storage/blobs.py): uploads still stream into a local temporary file while being hashed and
validated, and only a validated upload becomes an object (boto3's managed transfer uploads large
files in parts), so a refused upload leaves no object behind. Readers that need a file (a
memory-mapped dataset, a model to stream back) get a copy from a content-addressed cache on local
disk: fetched once, checked against its address (the key is the SHA-256 of its bytes), evicted
least recently used first beyond a size bound.

Any S3 API works (AWS S3, MinIO, Ceph, GCS's S3 API): the endpoint and credentials come from the
usual AWS settings (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``), read by boto3 itself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from kernel.storage.blobs import BlobStore, StorageUnavailable, validate_key

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["BlobCache", "S3BlobStore", "S3Location"]

_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @classmethod
    def parse(cls, url: str) -> S3Location:
        """``s3://bucket`` or ``s3://bucket/some/prefix``."""
        if not url.startswith("s3://"):
            raise ValueError(f"an S3 storage URL starts with s3://, got {url!r}")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"the S3 storage URL {url!r} names no bucket")
        prefix = prefix.strip("/")
        return cls(bucket=bucket, prefix=f"{prefix}/" if prefix else "")


class BlobCache:
    """Local copies of blobs by key, at most ``max_bytes`` in all (least recently used evicted
    first; a blob larger than the bound is still served, then evicted by the next fetch)."""

    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def get(self, key: str) -> Path | None:
        path = self.path(key)
        if not path.is_file():
            return None
        os.utime(path)  # recency for eviction
        return path

    def add(self, key: str, source: Path) -> Path:
        """Move ``source`` (a finished temporary file) into the cache as ``key``."""
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        self.evict(keep=target)
        return target

    def discard(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def keys(self) -> list[str]:
        """The keys held (a fetch still being written is not one)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file() and not p.name.startswith(".fetch-")
        )

    def evict(self, *, keep: Path | None = None) -> None:
        with self._lock:
            files = [p for p in self.root.rglob("*") if p.is_file() and not p.name.startswith(".fetch-")]
            sizes = {p: p.stat() for p in files}
            total = sum(s.st_size for s in sizes.values())
            for path in sorted(files, key=lambda p: sizes[p].st_mtime):
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                path.unlink(missing_ok=True)
                total -= sizes[path].st_size


class S3BlobStore(BlobStore):
    """The blob store on an S3 bucket (under a prefix); local files only in its cache."""

    private_files_elsewhere = True

    def __init__(
        self,
        location: S3Location,
        *,
        tmp_dir: Path,
        cache: BlobCache,
        client: S3Client | None = None,
    ) -> None:
        super().__init__(cache.root, tmp_dir)
        self.location = location
        self.cache = cache
        self.client: S3Client = client or boto3.client(
            "s3", config=Config(retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=5, read_timeout=60)
        )

    def _object(self, key: str) -> str:
        return self.location.prefix + validate_key(key)

    def local_path(self, key: str) -> Path:
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix=".fetch-")
        os.close(fd)
        fetched = Path(name)
        try:
            try:
                self.client.download_file(self.location.bucket, self._object(key), str(fetched))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _MISSING:
                    raise FileNotFoundError(f"blob {key} is not in the object store") from None
                raise StorageUnavailable(f"the object store refused to read blob {key}: {exc}") from exc
            except BotoCoreError as exc:
                raise StorageUnavailable(f"the object store is unreachable: {exc}") from exc
            _check_content(fetched, key)
            return self.cache.add(key, fetched)
        finally:
            fetched.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.location.bucket, Key=self._object(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return False
            raise StorageUnavailable(f"the object store refused to look up blob {key}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageUnavailable(f"the object store is unreachable: {exc}") from exc
        return True

    def adopt(self, pending_path: Path, sha256: str, *, keep_pending: bool = False) -> tuple[str, bool]:
        """Upload a finished temporary file to its content address (multipart for large files);
        returns (key, newly_created). The temporary file is removed unless ``keep_pending``."""
        key = self.key_for(sha256)
        if self.exists(key):
            if not keep_pending:
                pending_path.unlink(missing_ok=True)
            return key, False
        try:
            self.client.upload_file(str(pending_path), self.location.bucket, self._object(key))
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"the object store did not take blob {key}: {exc}") from exc
        if not keep_pending:
            pending_path.unlink(missing_ok=True)
        return key, True

    def delete(self, key: str) -> None:
        self.cache.discard(key)
        try:
            self.client.delete_object(Bucket=self.location.bucket, Key=self._object(key))
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"the object store did not delete blob {key}: {exc}") from exc

    def free_bytes(self) -> int:
        """Room for new uploads: the local disk their temporary files are written to."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.tmp_dir).free

    def presigned_url(self, key: str, *, filename: str, ttl_s: int) -> str | None:
        """Signed locally (no request to the store): anyone holding it may GET the blob until it
        expires, so it is handed only to a caller who passed the tenant checks."""
        try:
            return self.client.generate_presigned_url(
                "get_object",
                Params={
                    "Bucket": self.location.bucket,
                    "Key": self._object(key),
                    "ResponseContentDisposition": f'attachment; filename="{filename}"',
                    "ResponseContentType": "application/octet-stream",
                },
                ExpiresIn=ttl_s,
            )
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"could not sign a download URL for blob {key}: {exc}") from exc

    def _private(self, name: str) -> str:
        return f"{self.location.prefix}private/{validate_key(name)}"

    def save_private(self, name: str, source: Path) -> None:
        try:
            self.client.upload_file(str(source), self.location.bucket, self._private(name))
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"the object store did not take private file {name}: {exc}") from exc

    def fetch_private(self, name: str, target: Path) -> bool:
        target.parent.mkdir(parents=True, exist_ok=True)
        fetched = target.with_name(f".fetch-{target.name}")
        try:
            self.client.download_file(self.location.bucket, self._private(name), str(fetched))
        except ClientError as exc:
            fetched.unlink(missing_ok=True)
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return False
            raise StorageUnavailable(f"the object store refused to read private file {name}: {exc}") from exc
        except BotoCoreError as exc:
            fetched.unlink(missing_ok=True)
            raise StorageUnavailable(f"the object store is unreachable: {exc}") from exc
        os.replace(fetched, target)
        return True

    def delete_private(self, name: str) -> None:
        try:
            self.client.delete_object(Bucket=self.location.bucket, Key=self._private(name))
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"the object store did not delete private file {name}: {exc}") from exc

    def private_names(self) -> list[str]:
        area = f"{self.location.prefix}private/"
        names: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.location.bucket, Prefix=area)
            for page in pages:
                names.extend(item["Key"].removeprefix(area) for item in page.get("Contents", []))
        except (BotoCoreError, ClientError) as exc:
            raise StorageUnavailable(f"the object store did not list private files: {exc}") from exc
        return names

    def cached_keys(self) -> list[str]:
        return self.cache.keys()

    def discard_cached(self, key: str) -> None:
        self.cache.discard(key)


def _check_content(path: Path, key: str) -> None:
    """A content-addressed blob's bytes must hash to its key (a corrupted or substituted object
    is refused, never trained on)."""
    expected = key.rsplit("/", 1)[-1]
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise StorageUnavailable(f"blob {key} in the object store does not match its content address")
