"""Hostile NPZ files: zip bombs, pickles, lying headers and corrupt bytes are refused cleanly."""

from __future__ import annotations

import contextlib
import io
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.ingest import DatasetValidationError, IngestLimits, parse_dataset

MiB = 1024**2


def _parse(path: Path, *, limits: IngestLimits | None = None) -> object:
    return parse_dataset(path, fmt="npz", label_column=None, task=None, limits=limits or IngestLimits())


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _write_zip(path: Path, members: dict[str, bytes], *, compression: int) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_zip_bomb_is_refused_from_the_directory_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n_rows, n_features = 300 * MiB // (8 * 1000), 1000  # ~300 MB of float64 zeros
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": (n_rows, n_features)}
    )
    path = tmp_path / "bomb.npz"
    zeros = bytes(MiB)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("X.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            remaining = n_rows * n_features * 8
            while remaining:
                chunk = zeros[: min(remaining, MiB)]
                member.write(chunk)
                remaining -= len(chunk)
        archive.writestr("y.npy", _npy_bytes(np.zeros(n_rows, np.int64)))
    assert path.stat().st_size < 5 * MiB

    def no_member_may_be_opened(*args: object) -> None:
        raise AssertionError("a member was opened (and would be decompressed)")

    monkeypatch.setattr(zipfile.ZipFile, "open", no_member_may_be_opened)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path, limits=IngestLimits(max_decompressed_bytes=10 * MiB))
    assert caught.value.reason == "too-large-decompressed"
    assert str(10 * MiB) in caught.value.detail


def test_pickled_object_array_is_refused(tmp_path: Path) -> None:
    X = np.array([[{"token": "SECRET123"}, 1.0], [2.0, 3.0]], dtype=object)
    path = tmp_path / "pickled.npz"
    np.savez(path, X=X, y=np.array([0, 1]))  # savez pickles object arrays
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "invalid-npz"
    assert "X.npy" in caught.value.detail and "pickled" in caught.value.detail
    assert "SECRET123" not in caught.value.detail


def test_pickled_labels_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "pickled_y.npz"
    np.savez(path, X=np.ones((2, 2)), y=np.array([0, "SECRET123"], dtype=object))
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert (caught.value.reason, "y.npy" in caught.value.detail) == ("invalid-npz", True)


def test_header_claiming_more_data_than_the_member_holds(tmp_path: Path) -> None:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (1000, 1000)})
    members = {
        "X.npy": header.getvalue() + bytes(80),
        "y.npy": _npy_bytes(np.zeros(1000, np.int64)),
    }
    path = _write_zip(tmp_path / "liar.npz", members, compression=zipfile.ZIP_STORED)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "invalid-npz"
    assert "X.npy" in caught.value.detail and "(1000, 1000)" in caught.value.detail


def test_member_that_is_not_npy(tmp_path: Path) -> None:
    members = {"X.npy": b"SECRET123,1,2\n", "y.npy": _npy_bytes(np.arange(2))}
    path = _write_zip(tmp_path / "text.npz", members, compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "invalid-npz"
    assert "X.npy" in caught.value.detail and "SECRET123" not in caught.value.detail


def test_unsafe_compression_method_is_refused(tmp_path: Path) -> None:
    members = {"X.npy": _npy_bytes(np.ones((4, 2))), "y.npy": _npy_bytes(np.arange(4) % 2)}
    path = _write_zip(tmp_path / "bz2.npz", members, compression=zipfile.ZIP_BZIP2)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "invalid-npz"
    assert "compression" in caught.value.detail


def test_corrupt_member_data_fails_the_crc(tmp_path: Path) -> None:
    payload = _npy_bytes(np.arange(64, dtype=np.float64).reshape(32, 2))
    path = _write_zip(
        tmp_path / "crc.npz",
        {"X.npy": payload, "y.npy": _npy_bytes(np.arange(32) % 2)},
        compression=zipfile.ZIP_STORED,
    )
    data = bytearray(path.read_bytes())
    data[data.index(payload) + len(payload) - 1] ^= 0xFF  # last byte of X's data
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "invalid-npz"


def _valid_npz_bytes(compressed: bool) -> bytes:
    buffer = io.BytesIO()
    save = np.savez_compressed if compressed else np.savez
    save(buffer, X=np.arange(24, dtype=np.float32).reshape(6, 2, 2), y=np.arange(6) % 2)
    return buffer.getvalue()


@settings(database=None, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    compressed=st.booleans(),
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_corrupted_npz_only_ever_raises_validation_errors(compressed: bool, flips: list[tuple[float, int]]) -> None:
    data = bytearray(_valid_npz_bytes(compressed))
    for where, mask in flips:
        data[int(where * len(data))] ^= mask
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "upload.npz"
        path.write_bytes(bytes(data))
        with contextlib.suppress(DatasetValidationError):
            _parse(path)
