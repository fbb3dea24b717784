"""Content-addressed blob storage under the data dir (datasets, models, reports), and the
interface every store offers: kernel/storage/s3.py keeps blobs in an object store behind the same
methods, and kernel/storage/configured.py picks the store the settings name.

Uploads stream into a temporary file while being hashed; only a validated upload is moved to
its content address, so a rejected upload leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO


class UploadTooLarge(Exception):
    """The stream exceeded the configured limit."""


class StorageUnavailable(Exception):
    """The blob store could not be reached or refused an operation (an object store outage):
    a 503 at the API, a retry later for a worker; nothing a user stored is lost."""


def validate_key(key: str) -> str:
    """A blob key as the store writes them: relative, no '..' (never a path outside the store)."""
    if ".." in key.split("/") or key.startswith("/") or not key:
        raise ValueError("invalid blob key")
    return key


class PendingBlob:
    """A blob being written: bytes go to a temp file and into a running SHA-256."""

    def __init__(self, tmp_dir: Path, *, max_bytes: int | None) -> None:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="upload-")
        self.path = Path(name)
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0
        self._max_bytes = max_bytes

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._max_bytes is not None and self.size > self._max_bytes:
            raise UploadTooLarge(f"upload exceeds {self._max_bytes} bytes")
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> str:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return self._hash.hexdigest()

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


class BlobStore:
    """Blobs as files under ``root`` (the embedded default); kernel/storage/s3.py keeps them in an
    S3-compatible object store behind the same methods."""

    private_files_elsewhere = False
    """Whether :meth:`save_private` copies a worker's private file off its host (then the worker
    may delete its own copy); here every worker shares one host's disk, the file is the copy."""

    def __init__(self, root: Path, tmp_dir: Path) -> None:
        self.root = root
        self.tmp_dir = tmp_dir

    @staticmethod
    def key_for(sha256: str) -> str:
        return f"sha256/{sha256[:2]}/{sha256}"

    def local_path(self, key: str) -> Path:
        """A local file with the blob's bytes, for reading only (here the blob itself; for an
        object store, a cached copy). FileNotFoundError when there is no such blob."""
        path = self.root / validate_key(key)
        if not path.is_file():
            raise FileNotFoundError(f"blob {key} is not in the store")
        return path

    def exists(self, key: str) -> bool:
        return (self.root / validate_key(key)).is_file()

    def begin(self, *, max_bytes: int | None = None) -> PendingBlob:
        return PendingBlob(self.tmp_dir, max_bytes=max_bytes)

    def adopt(self, pending_path: Path, sha256: str, *, keep_pending: bool = False) -> tuple[str, bool]:
        """Move a finished temp file to its content address; returns (key, newly_created).

        When the blob already exists the temp file is a duplicate and is removed, unless
        ``keep_pending``: an upload keeps its copy until its dataset row is committed, so that
        it can restore the blob if a concurrent, failed upload of the same bytes removed it.
        """
        key = self.key_for(sha256)
        target = self.root / key
        if target.is_file():
            if not keep_pending:
                pending_path.unlink(missing_ok=True)
            return key, False
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(pending_path, target)
        os.chmod(target, 0o440)
        return key, True

    def put_chunks(self, chunks: Iterable[bytes]) -> tuple[str, str]:
        """Store a finished artifact given as chunks; returns (key, sha256)."""
        pending = self.begin()
        try:
            for chunk in chunks:
                pending.write(chunk)
            digest = pending.finish()
        except BaseException:
            pending.discard()
            raise
        key, _ = self.adopt(pending.path, digest)
        return key, digest

    def put_file(self, source: Path) -> tuple[str, str]:
        with source.open("rb") as handle:
            return self.put_chunks(iter(lambda: handle.read(1 << 20), b""))

    def put_bytes(self, data: bytes) -> tuple[str, str]:
        return self.put_chunks([data])

    def delete(self, key: str) -> None:
        (self.root / validate_key(key)).unlink(missing_ok=True)

    def free_bytes(self) -> int:
        self.root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.root).free

    def presigned_url(self, key: str, *, filename: str, ttl_s: int) -> str | None:
        """A short-lived URL the object store serves the blob at, or None (here: files have none)."""
        validate_key(key)
        return None

    # A worker's private state of a running job (its checkpoint, its hold-out split): secret, never
    # served, deleted when the job settles. Kept in the store so that a retry on another host finds it.

    def save_private(self, name: str, source: Path) -> None:
        """Keep ``source`` as the private file ``name``. Here nothing to do: the worker's own file
        is the copy, since every worker of a filesystem store shares one host's disk."""
        validate_key(name)

    def fetch_private(self, name: str, target: Path) -> bool:
        """Write the private file ``name`` to ``target``; False when there is none elsewhere."""
        validate_key(name)
        return False

    def delete_private(self, name: str) -> None:
        validate_key(name)

    def private_names(self) -> list[str]:
        """The names of the private files kept in the store; here none (the workers' own folder
        is the only copy)."""
        return []

    # Local copies of blobs kept elsewhere (an object store's cache): evicted once erased.

    def cached_keys(self) -> list[str]:
        """Keys of blobs copied to this host's cache; here none (the files are the blobs)."""
        return []

    def discard_cached(self, key: str) -> None:
        """Remove this host's cached copy of ``key``, if any."""
        validate_key(key)
