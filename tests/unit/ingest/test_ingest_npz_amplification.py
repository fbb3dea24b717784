"""NPZ decompression amplification: a small upload may not make the API inflate gigabytes.

The declared sizes are bounded absolutely and relative to the upload's size on disk, before a
member is opened; the bytes actually inflated are counted against the same allowance.
"""

from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from kernel.ingest import DatasetValidationError, IngestLimits, parse_dataset
from kernel.ingest.limits import RATIO_FREE_BYTES
from kernel.ingest.npz_reader import _Allowance, _CountedMember, _load, _read_header

MiB = 1024**2
GiB = 1024**3


def _parse(path: Path, *, limits: IngestLimits | None = None) -> object:
    return parse_dataset(path, fmt="npz", label_column=None, task=None, limits=limits or IngestLimits())


def _npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _full_flush(data: bytes) -> bytes:
    """A raw deflate fragment that ends byte-aligned and refers to nothing before it."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


def _write_zip(path: Path, members: list[tuple[str, bytes, int, int]]) -> None:
    """A plain zip of already-deflated members: (name, raw deflate, crc32, uncompressed size)."""
    out = bytearray()
    central = bytearray()
    for name, data, crc, size in members:
        encoded = name.encode()
        offset = len(out)
        out += (
            struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(data), size, len(encoded), 0)
            + encoded
            + data
        )
        central += (
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                20,
                20,
                0,
                8,
                0,
                0x21,
                crc,
                len(data),
                size,
                len(encoded),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + encoded
        )
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(out), 0)
    path.write_bytes(bytes(out))


def _deflate_bomb(path: Path, *, n_rows: int = MiB) -> Path:
    """X of n_rows × 256 float64 zeros, deflated ~1000×: the default is 2 GiB in about 2 MB."""
    n_features = 256
    header = _npy_header((n_rows, n_features), "<f8")
    zeros = bytes(MiB)
    n_chunks = n_rows * n_features * 8 // MiB
    chunk = _full_flush(zeros)
    data = _full_flush(header) + chunk * n_chunks + b"\x03\x00"  # empty final block
    crc = zlib.crc32(header)
    for _ in range(n_chunks):
        crc = zlib.crc32(zeros, crc)
    labels = _npy_header((n_rows,), "|i1") + bytes(n_rows)
    _write_zip(
        path,
        [
            ("X.npy", data, crc, len(header) + n_rows * n_features * 8),
            ("y.npy", _full_flush(labels) + b"\x03\x00", zlib.crc32(labels), len(labels)),
        ],
    )
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _deflate_bomb(tmp_path_factory.mktemp("bomb") / "bomb.npz")


def _forbid_opening_members(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_member_may_be_opened(*args: object) -> None:
        raise AssertionError("a member was opened (and would be decompressed)")

    monkeypatch.setattr(zipfile.ZipFile, "open", no_member_may_be_opened)


def test_the_bomb_is_a_genuine_archive(bomb: Path) -> None:
    assert bomb.stat().st_size < 3 * MiB
    with zipfile.ZipFile(bomb) as archive:
        assert archive.getinfo("X.npy").file_size > 2 * GiB
        with archive.open("X.npy") as member:  # inflates a prefix only
            assert np.lib.format.read_magic(member) == (1, 0)
            assert np.lib.format.read_array_header_1_0(member)[0] == (MiB, 256)
            assert member.read(MiB) == bytes(MiB)


def test_the_bomb_construction_parses_when_small(tmp_path: Path) -> None:
    """The same construction at 8 MiB inflates fully with valid CRCs, so the large one is real."""
    parsed = _parse(_deflate_bomb(tmp_path / "small.npz", n_rows=4096))
    assert parsed.X.shape == (4096, 256)  # type: ignore[attr-defined]


def test_small_npz_declaring_2_gib_is_refused_before_decompression(bomb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_opening_members(monkeypatch)
    started = time.perf_counter()
    with pytest.raises(DatasetValidationError) as caught:
        _parse(bomb)
    assert time.perf_counter() - started < 1.0
    assert caught.value.reason == "too-large-decompressed"
    # The ratio limit (200 × ~2 MB ≈ 400 MB) is the tighter one for this file.
    assert "compression ratio limit is 200" in caught.value.detail
    assert f"the limit is {200 * bomb.stat().st_size} bytes" in caught.value.detail


def test_absolute_limit_applies_whatever_the_ratio(bomb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid_opening_members(monkeypatch)
    limits = IngestLimits(max_compression_ratio=10**6)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(bomb, limits=limits)
    assert caught.value.reason == "too-large-decompressed"
    assert caught.value.detail.endswith(f"the limit is {limits.max_decompressed_bytes} bytes")
    assert limits.max_decompressed_bytes == GiB


@pytest.fixture(scope="module")
def compressible(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """96 MiB of float32 zeros in about 100 kB: over 200× and over the ratio-free 64 MiB."""
    path = tmp_path_factory.mktemp("ratio") / "zeros.npz"
    n_rows = 96 * MiB // (4 * 64)
    np.savez_compressed(path, X=np.zeros((n_rows, 64), np.float32), y=np.zeros(n_rows, np.int8))
    return path


def test_ratio_violating_npz_is_refused(compressible: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = compressible.stat().st_size
    assert 96 * MiB > 200 * size and 96 * MiB > RATIO_FREE_BYTES
    _forbid_opening_members(monkeypatch)
    with pytest.raises(DatasetValidationError) as caught:
        _parse(compressible)
    assert caught.value.reason == "too-large-decompressed"
    assert f"the limit is {RATIO_FREE_BYTES} bytes" in caught.value.detail  # 200 × size is less
    assert "compression ratio limit is 200" in caught.value.detail


def test_the_same_npz_passes_under_a_looser_ratio(compressible: Path) -> None:
    parsed = _parse(compressible, limits=IngestLimits(max_compression_ratio=100_000))
    assert parsed.X.shape == (96 * MiB // 256, 64)  # type: ignore[attr-defined]


def test_small_highly_compressible_npz_is_exempt_from_the_ratio(tmp_path: Path) -> None:
    path = tmp_path / "sparse.npz"
    X = np.zeros((20_000, 100), np.float32)  # 8 MB of zeros: ~1000× but under 64 MiB
    X[::100, 0] = 1.0
    np.savez_compressed(path, X=X, y=np.arange(20_000) % 2)
    assert 8 * MiB > 200 * path.stat().st_size
    parsed = _parse(path)
    assert parsed.X.shape == (20_000, 100)  # type: ignore[attr-defined]


@pytest.mark.parametrize("compressed", [False, True])
def test_ordinary_npz_still_passes(tmp_path: Path, compressed: bool) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "ok.npz"
    save = np.savez_compressed if compressed else np.savez
    save(path, X=rng.normal(size=(5000, 30)), y=rng.integers(0, 3, 5000))
    parsed = _parse(path)
    assert parsed.X.shape == (5000, 30)  # type: ignore[attr-defined]


def test_inflated_bytes_are_counted_against_the_allowance() -> None:
    """Should a member ever inflate past what it declared, reading stops at the allowance."""
    allowance = _Allowance(limit=10, wording="10 bytes")
    member = _CountedMember(io.BytesIO(bytes(8)), allowance=allowance)
    assert member.read(8) == bytes(8)
    second = _CountedMember(io.BytesIO(bytes(8)), allowance=allowance)  # shared across members
    with pytest.raises(DatasetValidationError) as caught:
        second.read()
    assert caught.value.reason == "too-large-decompressed"
    assert "the limit is 10 bytes" in caught.value.detail


def test_streamed_refusal_is_not_reported_as_a_corrupt_member(tmp_path: Path) -> None:
    """The guard's refusal keeps its reason through the loader's corrupt-member handling."""
    path = tmp_path / "ok.npz"
    np.savez_compressed(path, X=np.ones((100, 4)), y=np.zeros(100))
    with zipfile.ZipFile(path) as archive:
        header = _read_header(archive, archive.getinfo("X.npy"))
        with pytest.raises(DatasetValidationError) as caught:
            _load(archive, header, allowance=_Allowance(limit=1000, wording="1000 bytes"))
    assert caught.value.reason == "too-large-decompressed"
    assert caught.value.detail.endswith("the limit is 1000 bytes")
