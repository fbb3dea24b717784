"""NPZ reader: arrays X and y from a zip of .npy members, checked before anything is decompressed.

An upload is untrusted: the zip directory and each .npy header are read and checked against the
limits first (declared sizes, dtype, shape), so a zip bomb or a header that lies about its shape
is refused before numpy allocates or inflates anything. The declared total is bounded absolutely
and relative to the upload's size on disk (compression ratio). Arrays are then read only through
numpy with allow_pickle=False, and only from stored or deflated members, whose decompression
zipfile bounds per read; the bytes actually inflated are counted against the same allowance.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from kernel.ingest.columns import ScalingGroup
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.limits import IngestLimits
from kernel.ingest.numeric import as_float32, first_non_finite
from kernel.ingest.parse_control import checkpoint
from kernel.ingest.preparation import SCALE_ALL, Preparation, check_preparation_for_format
from kernel.ingest.registry import RawDataset, RawLabels, RowPositions, register_reader

_FEATURES = "X.npy"
_LABELS = "y.npy"
_NUMERIC_KINDS = frozenset("biuf")  # bool, signed and unsigned integer, float
_SAFE_COMPRESSION = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_ENCRYPTED_FLAG = 0x1
_MAX_DIMS = 32
"""numpy's own limit on dimensions (64) is far above the 4 a dataset may have."""
# What zipfile and numpy raise on a damaged archive or member (found by fuzzing, see the tests).
_MEMBER_ERRORS = (
    ValueError,
    EOFError,
    OSError,
    NotImplementedError,
    zipfile.BadZipFile,
    zlib.error,
)

_HeaderReader = Callable[[IO[bytes]], tuple[tuple[int, ...], bool, np.dtype]]
_HEADER_READERS: dict[tuple[int, int], _HeaderReader] = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


@dataclass(frozen=True)
class _NpyHeader:
    """What a member's .npy header declares, checked before the data is read."""

    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype


@register_reader("npz")
def read_npz(
    path: Path,
    *,
    label_column: str | None,
    limits: IngestLimits,
    preparation: Preparation | None,
    unit_column: str | None = None,
) -> RawDataset:
    """Parse an NPZ upload; ``label_column`` is ignored because ``y`` is the label by definition.

    Its features have no names, so of a declared preparation only ``scale["*"]`` applies, and it
    has no column to name as a privacy unit.
    """
    if unit_column is not None:
        raise DatasetValidationError(
            "privacy-unit-unsupported-format",
            "privacy_unit_column names a CSV column; an NPZ upload has no columns. Upload the rows as a CSV "
            "with an identifier column to train with one privacy unit per person",
        )
    check_preparation_for_format(preparation, has_column_names=False)
    everything = preparation.scale.get(SCALE_ALL) if preparation is not None else None
    features, labels = read_npz_arrays(path, limits=limits)
    return RawDataset(
        X=_features_float32(features),
        labels=RawLabels(numbers=_labels_float64(labels)),
        feature_names=None,
        rows=RowPositions(),
        scaling=(ScalingGroup(features=None, scaling=everything),) if everything is not None else (),
    )


@dataclass(frozen=True)
class _CheckedArchive:
    archive: zipfile.ZipFile
    features: _NpyHeader
    labels: _NpyHeader
    allowance: _Allowance


@contextmanager
def _checked_archive(path: Path, *, limits: IngestLimits) -> Iterator[_CheckedArchive]:
    """The open archive with both members' headers read and every check of names and shapes passed."""
    allowance = _Allowance.of(limits, compressed_bytes=path.stat().st_size)
    with _open_zip(path) as archive:
        features_info, labels_info = _inspect_members(archive, allowance=allowance)
        features_header = _read_header(archive, features_info)
        labels_header = _read_header(archive, labels_info)
        _check_shapes(features_header, labels_header, limits=limits)
        yield _CheckedArchive(archive, features_header, labels_header, allowance)


def read_npz_arrays(path: Path, *, limits: IngestLimits) -> tuple[np.ndarray, np.ndarray]:
    """X and y exactly as stored (any numeric dtype), after every check of the archive and shapes."""
    with _checked_archive(path, limits=limits) as checked:
        features = _load(checked.archive, checked.features, allowance=checked.allowance)
        labels = _load(checked.archive, checked.labels, allowance=checked.allowance)
    return features, labels


def read_npz_labels(path: Path, *, limits: IngestLimits) -> np.ndarray:
    """y alone, after the same checks as read_npz_arrays (the worker's labels of an image NPZ,
    whose images it reads from their decoded array instead)."""
    with _checked_archive(path, limits=limits) as checked:
        return _load(checked.archive, checked.labels, allowance=checked.allowance)


def npz_features_header(path: Path, *, limits: IngestLimits) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype X declares, read from its .npy header only (decides image vs numeric)."""
    allowance = _Allowance.of(limits, compressed_bytes=path.stat().st_size)
    with _open_zip(path) as archive:
        features_info, _labels_info = _inspect_members(archive, allowance=allowance)
        header = _read_header(archive, features_info)
    return header.shape, header.dtype


def labels_as_numbers(labels: np.ndarray) -> np.ndarray:
    """y as finite float64 numbers, for the task rules of kernel/ingest/labels.py."""
    return _labels_float64(labels)


class _Allowance:
    """Decompressed bytes this upload may still produce: checked on the declared sizes first,
    then decremented by every byte actually inflated (should a member ever yield more)."""

    def __init__(self, *, limit: int, wording: str) -> None:
        self.limit = limit
        self.wording = wording
        self.remaining = limit

    @classmethod
    def of(cls, limits: IngestLimits, *, compressed_bytes: int) -> _Allowance:
        limit, wording = limits.decompressed_allowance(compressed_bytes=compressed_bytes)
        return cls(limit=limit, wording=wording)

    def refuse(self, what: str) -> DatasetValidationError:
        return DatasetValidationError("too-large-decompressed", f"{what}; the limit is {self.wording}")

    def spend(self, n_bytes: int) -> None:
        self.remaining -= n_bytes
        if self.remaining < 0:
            raise self.refuse(f"the archive decompressed to more than {self.limit} bytes")


class _CountedMember:
    """A member opened for reading whose inflated bytes are charged to the allowance."""

    def __init__(self, member: IO[bytes], *, allowance: _Allowance) -> None:
        self._member = member
        self._allowance = allowance

    def read(self, size: int = -1) -> bytes:
        checkpoint()  # numpy reads an array in chunks of 256 KiB: stop between them when asked to
        data = self._member.read(size)
        self._allowance.spend(len(data))
        return data


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise DatasetValidationError(
            "invalid-npz", "the file is not a readable zip archive, which an .npz file is"
        ) from exc


def _inspect_members(archive: zipfile.ZipFile, *, allowance: _Allowance) -> tuple[zipfile.ZipInfo, zipfile.ZipInfo]:
    """Find X and y and refuse the archive on its declared sizes alone, before inflating a byte."""
    infos = archive.infolist()
    by_name = {info.filename: info for info in infos}
    missing = [name for name in (_FEATURES, _LABELS) if name not in by_name]
    if missing:
        raise DatasetValidationError(
            "missing-array",
            f"the archive has no {' and no '.join(missing)}; an .npz dataset needs arrays X and y",
        )
    declared = sum(info.file_size for info in infos)
    if declared > allowance.limit:
        raise allowance.refuse(f"the archive's members declare {declared} bytes uncompressed")
    for name in (_FEATURES, _LABELS):
        info = by_name[name]
        if info.flag_bits & _ENCRYPTED_FLAG:
            raise DatasetValidationError("invalid-npz", f"{name} is encrypted")
        if info.compress_type not in _SAFE_COMPRESSION:
            raise DatasetValidationError(
                "invalid-npz",
                f"{name} uses an unsupported compression method; write the file with "
                "numpy.savez or numpy.savez_compressed",
            )
    return by_name[_FEATURES], by_name[_LABELS]


def _read_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> _NpyHeader:
    """Read only the .npy header and check that the member can hold what it declares."""
    name = info.filename
    try:
        with archive.open(info) as member:
            read_header = _HEADER_READERS.get(np.lib.format.read_magic(member))
            if read_header is None:
                raise ValueError("unsupported .npy format version")
            shape, _fortran_order, dtype = read_header(member)
            data_offset = member.tell()
    except _MEMBER_ERRORS as exc:
        raise DatasetValidationError(
            "invalid-npz", f"{name} is not a valid .npy array (format version 1.0 or 2.0)"
        ) from exc
    if len(shape) > _MAX_DIMS or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise DatasetValidationError(
            "invalid-npz",
            f"{name}'s header declares an invalid shape: at most {_MAX_DIMS} whole numbers, none negative",
        )
    if dtype.hasobject:
        raise DatasetValidationError(
            "invalid-npz",
            f"{name} is an object array; pickled (object) arrays are not allowed, only numeric ones",
        )
    if dtype.kind not in _NUMERIC_KINDS:
        raise DatasetValidationError(
            "non-numeric",
            f"{name} has dtype {dtype.str!r}; only bool, integer and float arrays are allowed",
        )
    declared_bytes = math.prod(shape) * dtype.itemsize
    if declared_bytes > info.file_size - data_offset:
        raise DatasetValidationError(
            "invalid-npz",
            f"{name}'s header declares shape {shape} ({declared_bytes} bytes) but the member "
            f"holds only {max(info.file_size - data_offset, 0)} bytes of data",
        )
    return _NpyHeader(info=info, shape=shape, dtype=dtype)


def _check_shapes(features: _NpyHeader, labels: _NpyHeader, *, limits: IngestLimits) -> None:
    if len(features.shape) not in (2, 3, 4):
        raise DatasetValidationError(
            "shape-mismatch",
            f"X has {len(features.shape)} dimensions; it must be (n, d), (n, H, W) or (n, C, H, W)",
        )
    if len(labels.shape) != 1:
        raise DatasetValidationError("shape-mismatch", f"y has {len(labels.shape)} dimensions; it must be (n,)")
    n_rows = features.shape[0]
    if labels.shape[0] != n_rows:
        raise DatasetValidationError("shape-mismatch", f"X has {n_rows} rows but y has {labels.shape[0]}")
    if n_rows == 0:
        raise DatasetValidationError("empty-dataset", "X and y have no rows")
    if n_rows > limits.max_rows:
        raise DatasetValidationError("too-many-rows", f"X has {n_rows} rows; the limit is {limits.max_rows}")
    n_features = math.prod(features.shape[1:])
    if n_features == 0:
        raise DatasetValidationError("empty-dataset", f"X has shape {features.shape}: no features per row")
    if n_features > limits.max_features:
        raise DatasetValidationError(
            "too-many-columns",
            f"X has {n_features} features per row (shape {features.shape[1:]}); the limit is {limits.max_features}",
        )


def _load(archive: zipfile.ZipFile, header: _NpyHeader, *, allowance: _Allowance) -> np.ndarray:
    name = header.info.filename
    try:
        with archive.open(header.info) as member:
            # read_array is what np.load runs on a .npy stream; only read() is needed from it.
            loaded = np.lib.format.read_array(_CountedMember(member, allowance=allowance), allow_pickle=False)
    except DatasetValidationError:
        raise
    except _MEMBER_ERRORS as exc:
        raise DatasetValidationError("invalid-npz", f"{name} could not be read: it is truncated or corrupt") from exc
    if not isinstance(loaded, np.ndarray) or loaded.shape != header.shape or loaded.dtype != header.dtype:
        raise DatasetValidationError("invalid-npz", f"{name} does not hold the array its header declares")
    return loaded


def _features_float32(features: np.ndarray) -> np.ndarray:
    X = as_float32(features)
    bad = first_non_finite(X)
    if bad is not None:
        raise DatasetValidationError(
            "non-finite",
            f"X at index {bad} is NaN, infinite or too large for float32",
        )
    return X[:, np.newaxis] if X.ndim == 3 else X


def _labels_float64(labels: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.ascontiguousarray(labels, dtype=np.float64)
    bad = first_non_finite(y)
    if bad is not None:
        raise DatasetValidationError("non-finite", f"y at index {bad[0]} is NaN or infinite")
    return y
