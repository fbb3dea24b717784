"""Files to and from the service: an upload's streamed body, and a download that lands whole or not at all.

A model download is written to ``<target>.part``, checked against the SHA-256 the API announced
(``X-Content-SHA256``), then renamed: a failed or corrupted download never leaves a partial model
at the target. A service with pre-signed downloads answers 307: the file is then fetched from
the object store's URL without the client's API key, and checked against the same digest.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from privtrain.errors import IntegrityError, TransportError

UPLOAD_CHUNK_BYTES = 1 << 16
FORMAT_BY_SUFFIX = {".csv": "csv", ".npz": "npz", ".zip": "zip", ".jsonl": "jsonl"}


@dataclass(frozen=True)
class UploadBody:
    """What a dataset upload sends, and what its file's name says (None for bytes)."""

    content: Callable[[], bytes | Iterator[bytes]]
    """A fresh body per attempt: a retried upload streams the file again."""
    headers: dict[str, str]
    inferred_format: str | None
    inferred_name: str | None


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(UPLOAD_CHUNK_BYTES):
            yield chunk


def upload_body(source: Path | bytes) -> UploadBody:
    """Bytes as they are; a file streamed from disk, with its size, format (from its suffix) and name."""
    if isinstance(source, bytes):
        return UploadBody(content=lambda: source, headers={}, inferred_format=None, inferred_name=None)
    return UploadBody(
        content=lambda: _file_chunks(source),
        headers={"Content-Length": str(source.stat().st_size), "Content-Type": "application/octet-stream"},
        inferred_format=FORMAT_BY_SUFFIX.get(source.suffix.lower()),
        inferred_name=source.stem,
    )


@dataclass(frozen=True)
class ModelDownload:
    """Consumes the model's response (or its redirect) into ``target``, by way of ``partial``."""

    target: Path
    partial: Path
    timeout: httpx.Timeout

    def consume(self, response: httpx.Response) -> Path:
        expected = response.headers.get("x-content-sha256")
        if response.is_redirect:
            with (
                httpx.Client(timeout=self.timeout) as store,
                store.stream("GET", response.headers["location"]) as fetched,
            ):
                if fetched.status_code >= 400:
                    raise TransportError(
                        title="Download failed",
                        detail=f"the object store answered {fetched.status_code} for the model's pre-signed URL",
                    )
                return self._save(fetched, expected)
        return self._save(response, expected)

    def _save(self, response: httpx.Response, expected: str | None) -> Path:
        digest = hashlib.sha256()
        with self.partial.open("wb") as handle:
            for chunk in response.iter_bytes():
                digest.update(chunk)
                handle.write(chunk)
        if expected and expected != digest.hexdigest():
            self.partial.unlink(missing_ok=True)
            raise IntegrityError(
                title="Corrupted download",
                detail=f"model sha256 {digest.hexdigest()} != announced {expected}",
            )
        self.partial.replace(self.target)
        return self.target


def zipped_checkpoint(path: Path) -> bytes:
    """A ``save_pretrained`` folder as ZIP bytes (its files at the top), or a ZIP file's bytes as they are."""
    if not path.is_dir():
        return path.read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:  # weights hardly compress
        for file in sorted(path.iterdir()):
            if file.is_file():
                archive.write(file, file.name)
    return buffer.getvalue()
