"""What a dataset *is*, for its budget: a digest of its parsed rows, not of the uploaded bytes.

One content, one budget (docs/privacy-model.md#one-content-one-budget): the same rows must never
get a second budget, so re-registering them (while registered: refused; after a deletion: the old
ledger continues) is recognised by this digest. It is an exact function of the rows, so only the
owner sees it, like the bytes' SHA-256.

Each row becomes one canonical byte string in which **every value is paired with its column's
name** and the columns are sorted by name; each row is hashed, the row hashes are sorted and the
sorted list is hashed with the format family. So the digest does not change with:

* line endings (LF, CRLF), a byte-order mark, trailing newlines or blank lines;
* the order of the rows (duplicates still count: it is a multiset), and of the columns;
* how a number is spelled: ``1``, ``1.0``, ``1e0`` and ``+1`` are one number, ``-0`` is ``0``; in an
  NPZ, a float32 value and the same value as float64, an integer and the same float;
* for a ZIP of images: the order, names and compression of its members (a row is the class
  folder and the image file's bytes); for JSON Lines, the order of a record's members.

Anything else is new content, by design: a changed value (rounding included), an added or
dropped row or column, a renamed column, a re-encoded image, the same rows in another format.
Why the owner is trusted there is docs/privacy-model.md#what-the-digest-does-not-catch.

Torch-free; it reads files that the ingest (kernel/ingest) has already validated at upload, and
bounds what it reads the same way, so it also runs on uploads stored before it existed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import struct
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.image_zip import IGNORED_FILES, IGNORED_FOLDERS, IMAGE_SUFFIXES
from kernel.ingest.limits import IngestLimits
from kernel.ingest.npz_reader import read_npz_arrays

__all__ = ["DIGEST_VERSION", "ContentUnreadable", "canonical_value", "content_digest", "supported_formats"]

DIGEST_VERSION = b"privtrain-content-v1"
"""Changing the canonical form changes every digest: a new version, never an edit of this one."""

_ROW_DIGEST_BYTES = 32
_NPZ_CHUNK_ROWS = 4096
_MEMO_LIMIT = 65_536
"""Distinct CSV fields whose canonical form is remembered (categories, labels, small integers)."""


class ContentUnreadable(Exception):
    """The stored upload cannot be read as its format (never raised for an upload the ingest
    accepted with today's limits); the message names no value of the file."""


Digester = Callable[[Path, IngestLimits], tuple[bytes, bytearray]]
"""A format's reader: (its family tag, the concatenated 32-byte digests of its rows)."""

_DIGESTERS: dict[str, Digester] = {}


def _digester(*formats: str) -> Callable[[Digester], Digester]:
    def register(function: Digester) -> Digester:
        for fmt in formats:
            _DIGESTERS[fmt] = function
        return function

    return register


def supported_formats() -> tuple[str, ...]:
    return tuple(sorted(_DIGESTERS))


def content_digest(path: Path, *, fmt: str, limits: IngestLimits) -> str:
    """The content digest (hex SHA-256) of the upload at ``path`` in format ``fmt``."""
    digester = _DIGESTERS.get(fmt)
    if digester is None:
        raise ContentUnreadable(f"no content digest for format {fmt!r}")
    try:
        family, rows = digester(path, limits)
    except DatasetValidationError as exc:
        raise ContentUnreadable(f"the stored {fmt} upload cannot be read ({exc.reason})") from None
    except (OSError, ValueError, UnicodeDecodeError, csv.Error, zipfile.BadZipFile, RecursionError) as exc:
        raise ContentUnreadable(f"the stored {fmt} upload cannot be read ({type(exc).__name__})") from None
    return _combine(family, rows)


def _combine(family: bytes, rows: bytearray) -> str:
    """Hash the row digests in sorted order: the result ignores the order of the rows."""
    n_rows = len(rows) // _ROW_DIGEST_BYTES
    words = np.frombuffer(bytes(rows), dtype=">u8").reshape(n_rows, _ROW_DIGEST_BYTES // 8)
    order = np.lexsort(tuple(words[:, column] for column in reversed(range(words.shape[1]))))
    digest = hashlib.sha256(DIGEST_VERSION + b"\0" + family + b"\0" + n_rows.to_bytes(8, "big"))
    digest.update(np.ascontiguousarray(words[order]).tobytes())
    return digest.hexdigest()


# --------------------------------------------------------------------------------- values


def _frame(tag: bytes, payload: bytes) -> bytes:
    """One tagged, length-prefixed value: no two different sequences of values share an encoding."""
    return tag + len(payload).to_bytes(8, "big") + payload


def _number(value: float | int) -> bytes:
    """A number by its value, as an IEEE double (``1``, ``1.0`` and ``1e0`` are one number, ``-0``
    is ``0``); an integer too large for a double by its digits, non-finite values by name."""
    try:
        number = float(value)
    except OverflowError:
        return _frame(b"x", str(value).encode())
    if math.isnan(number):
        return _frame(b"x", b"nan")
    if math.isinf(number):
        return _frame(b"x", b"inf" if number > 0 else b"-inf")
    return _frame(b"f", struct.pack(">d", number + 0.0))


def canonical_value(value: Any) -> bytes:
    """A parsed JSON value (or a CSV field's reading) as canonical bytes: objects by sorted member
    name, numbers by value, strings as UTF-8."""
    if value is None:
        return _frame(b"n", b"")
    if isinstance(value, bool):
        return _frame(b"b", b"1" if value else b"0")
    if isinstance(value, int | float):
        return _number(value)
    if isinstance(value, str):
        return _frame(b"s", _utf8(value))
    if isinstance(value, list):
        return _frame(b"l", b"".join(canonical_value(item) for item in value))
    if isinstance(value, dict):
        members = sorted(value.items(), key=lambda item: item[0])
        return _frame(b"d", b"".join(_frame(b"k", _utf8(str(name))) + canonical_value(item) for name, item in members))
    raise ValueError(f"no canonical form for a {type(value).__name__}")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # JSON escapes may spell lone surrogates


def _field(text: str) -> bytes:
    """A CSV field: the finite number it reads as (as the ingest reads numbers: Python's float),
    else its text without surrounding spaces (as the ingest compares labels and categories)."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if math.isfinite(number):
        return _number(number)
    return _frame(b"s", _utf8(text.strip()))


_NUMBER_FRAME_HEAD = np.frombuffer(b"f" + (8).to_bytes(8, "big"), dtype=np.uint8)


def _column_frames(cells: tuple[str, ...], memo: dict[str, bytes]) -> np.ndarray | list[bytes]:
    """The frames of one column's cells in a chunk of rows: when every cell is a finite number (the
    usual feature column), as one (n, 17) byte matrix built by numpy; else one bytes per cell.
    Both are exactly :func:`_field`'s bytes: the fast path only computes them faster."""
    try:
        values = np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
    except ValueError:
        values = None
    if values is not None and bool(np.isfinite(values).all()):
        frames = np.empty((len(cells), 17), dtype=np.uint8)
        frames[:, :9] = _NUMBER_FRAME_HEAD
        frames[:, 9:] = (values + 0.0).astype(">f8").view(np.uint8).reshape(len(cells), 8)
        return frames
    out = []
    for text in cells:
        encoded = memo.get(text)
        if encoded is None:
            encoded = _field(text)
            if len(memo) < _MEMO_LIMIT:
                memo[text] = encoded
        out.append(encoded)
    return out


# --------------------------------------------------------------------------------- formats


@_digester("csv")
def _csv_rows(path: Path, limits: IngestLimits) -> tuple[bytes, bytearray]:
    """Rows of a CSV: every column (label, privacy unit and dropped ones included), by header name."""
    digests = bytearray()
    with path.open("r", encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, strict=True)
        header = next(reader, None)
        if not header:
            raise ValueError("no header")
        order = sorted(range(len(header)), key=lambda position: header[position])
        names = [np.frombuffer(_frame(b"c", _utf8(header[position])), dtype=np.uint8) for position in order]
        memo: dict[str, bytes] = {}
        for chunk in _row_chunks(reader, width=len(header), max_rows=limits.max_rows):
            columns = list(zip(*chunk, strict=True))
            parts = _row_parts(names, [_column_frames(columns[position], memo) for position in order], len(chunk))
            for row in range(len(chunk)):
                digest = hashlib.sha256()
                for part in parts:
                    if isinstance(part, list):
                        digest.update(part[row])
                    else:
                        flat, width = part
                        digest.update(flat[row * width : (row + 1) * width])
                digests += digest.digest()
    if not digests:
        raise ValueError("no rows")
    return b"table", digests


_CSV_CHUNK_ROWS = 512
"""Rows read before their columns are converted at once: small, so the rows held (Python lists the
garbage collector walks) stay few; numpy still amortises its per-call cost over a chunk."""


def _row_chunks(reader: Iterator[list[str]], *, width: int, max_rows: int) -> Iterator[list[list[str]]]:
    """Data rows in chunks (blank lines skipped: the ingest accepts trailing ones only)."""
    chunk: list[list[str]] = []
    count = 0
    for row in reader:
        if not row:
            continue
        count += 1
        if len(row) != width or count > max_rows:
            raise ValueError("a row does not fit the header, or there are too many rows")
        chunk.append(row)
        if len(chunk) == _CSV_CHUNK_ROWS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _row_parts(
    names: list[np.ndarray], columns: list[np.ndarray | list[bytes]], n_rows: int
) -> list[list[bytes] | tuple[memoryview, int]]:
    """Each row's canonical bytes as a few parts (a row's bytes are its parts concatenated): a run
    of all-number columns becomes one byte matrix, (its bytes, its row width); others stay one
    bytes per row."""
    parts: list[list[bytes] | tuple[memoryview, int]] = []
    run: list[np.ndarray] = []

    def close_run() -> None:
        if run:
            matrix = np.ascontiguousarray(np.concatenate(run, axis=1))
            parts.append((memoryview(matrix.tobytes()), matrix.shape[1]))
            run.clear()

    for name, frames in zip(names, columns, strict=True):
        run.append(np.broadcast_to(name, (n_rows, name.size)))
        if isinstance(frames, np.ndarray):
            run.append(frames)
        else:
            close_run()
            parts.append(frames)
    close_run()
    return parts


@_digester("npz")
def _npz_rows(path: Path, limits: IngestLimits) -> tuple[bytes, bytearray]:
    """Rows of an NPZ: X[i] (flattened, positions are its feature names) and y[i], by value."""
    features, labels = read_npz_arrays(path, limits=limits)
    n_rows = int(features.shape[0])
    x_name, y_name = _frame(b"c", b"X"), _frame(b"c", b"y")
    digests = bytearray()
    for start in range(0, n_rows, _NPZ_CHUNK_ROWS):
        stop = min(n_rows, start + _NPZ_CHUNK_ROWS)
        x = _canonical_floats(features[start:stop].reshape(stop - start, -1))
        y = _canonical_floats(labels[start:stop].reshape(stop - start, -1))
        x_bytes, y_bytes = x.shape[1] * 8, y.shape[1] * 8
        x_prefix = x_name + b"a" + x_bytes.to_bytes(8, "big")
        y_prefix = y_name + b"a" + y_bytes.to_bytes(8, "big")
        x_view, y_view = memoryview(x.tobytes()), memoryview(y.tobytes())
        for row in range(stop - start):
            digest = hashlib.sha256(x_prefix)
            digest.update(x_view[row * x_bytes : (row + 1) * x_bytes])
            digest.update(y_prefix)
            digest.update(y_view[row * y_bytes : (row + 1) * y_bytes])
            digests += digest.digest()
    if not digests:
        raise ValueError("no rows")
    return b"arrays", digests


def _canonical_floats(values: np.ndarray) -> np.ndarray:
    """Big-endian float64 with one zero (-0 is 0) and one NaN: equal values, equal bytes."""
    wide = values.astype(np.float64) + 0.0
    wide[np.isnan(wide)] = np.nan
    return np.ascontiguousarray(wide, dtype=">f8")


@_digester("zip")
def _zip_rows(path: Path, limits: IngestLimits) -> tuple[bytes, bytearray]:
    """Rows of a class-folder ZIP: (the folder, the image file's bytes), whatever the member's
    name, position or compression."""
    digests = bytearray()
    allowance, _ = limits.decompressed_allowance(compressed_bytes=path.stat().st_size)
    read = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            parts = PurePosixPath(info.filename).parts
            if not parts or parts[0] in IGNORED_FOLDERS or parts[-1] in IGNORED_FILES or info.is_dir():
                continue
            if len(parts) != 2 or PurePosixPath(parts[1]).suffix.lower() not in IMAGE_SUFFIXES:
                raise ValueError("a member outside the class-folder layout")
            read += info.file_size
            if read > allowance:
                raise ValueError("the images declare more than the limits allow")
            with archive.open(info) as member:
                data = member.read(info.file_size + 1)
            if len(data) != info.file_size:
                raise ValueError("a member holds other than it declares")
            digests += hashlib.sha256(
                _frame(b"c", b"image") + _frame(b"r", data) + _frame(b"c", b"label") + canonical_value(parts[0])
            ).digest()
    if not digests:
        raise ValueError("no images")
    return b"images", digests


@_digester("jsonl")
def _jsonl_rows(path: Path, limits: IngestLimits) -> tuple[bytes, bytearray]:
    """Rows of a JSON Lines upload: each record, every member by name."""
    digests = bytearray()
    with path.open("rb") as stream:
        for number, text in enumerate(_jsonl_lines(stream, max_bytes=limits.max_text_line_bytes), start=1):
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            if not text.strip():
                continue
            record = json.loads(text)
            if not isinstance(record, dict):
                raise ValueError("a line is not a JSON object")
            digests += hashlib.sha256(canonical_value(record)).digest()
    if not digests:
        raise ValueError("no records")
    return b"records", digests


def _jsonl_lines(stream: Any, *, max_bytes: int) -> Iterator[str]:
    """Lines without their ending (LF or CRLF), read with a byte cap as the ingest reads them."""
    while raw := stream.readline(max_bytes + 2):
        content = raw.removesuffix(b"\n").removesuffix(b"\r")
        if len(content) > max_bytes:
            raise ValueError("a line is longer than the limit")
        yield content.decode("utf-8")
