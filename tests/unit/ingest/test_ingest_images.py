"""Image uploads: class-folder ZIPs of PNG/JPEG and NPZs of uint8 images become uint8 arrays
(n, H, W, C) with labels from folder names (or y), and every unsafe or malformed upload is
refused with its own reason before anything large is decoded."""

from __future__ import annotations

import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kernel.ingest import (
    IMAGE_REASONS,
    DatasetValidationError,
    ImageOptions,
    IngestLimits,
    ParsedImages,
    image_facts,
    parse_image_labels,
    parse_image_size,
    parse_images,
    resolve_modality,
)
from tests.unit.ingest.image_fixtures import (
    class_images,
    image_zip,
    npz_bytes,
    pixel_bomb_zip,
    png,
    write,
    zip_bytes,
)


def _parse(
    path: Path,
    *,
    fmt: str = "zip",
    limits: IngestLimits | None = None,
    classes: tuple[str, ...] | None = None,
    channels: int | None = None,
    size: tuple[int, int] | None = None,
) -> ParsedImages:
    return parse_images(
        path,
        fmt=fmt,
        task=None,
        classes=classes,
        limits=limits or IngestLimits(),
        options=ImageOptions(channels=channels, size=size),
    )


def test_a_class_folder_zip_becomes_a_uint8_array_with_sorted_folder_classes(tmp_path: Path) -> None:
    images = class_images()
    parsed = _parse(write(tmp_path, image_zip(images)))
    assert parsed.images.dtype == np.uint8 and parsed.images.shape == (24, 8, 8, 1)
    assert parsed.classes is not None and parsed.classes.names == ("dark", "light")
    assert not parsed.classes.declared
    for row, name in enumerate(sorted(images)):  # rows in sorted path order, pixels exact (PNG)
        np.testing.assert_array_equal(parsed.images[row, :, :, 0], images[name])
        assert parsed.y[row] == (0 if name.startswith("dark/") else 1)
    facts = image_facts(parsed)
    assert facts["feature_shape"] == (1, 8, 8) and facts["n_features"] == 64 and facts["n_rows"] == 24


def test_declared_classes_order_the_labels_and_every_folder_must_be_declared(tmp_path: Path) -> None:
    path = write(tmp_path, image_zip())
    parsed = _parse(path, classes=("light", "dark", "unused"))
    assert parsed.classes is not None and parsed.classes.names == ("light", "dark", "unused")
    assert parsed.n_classes == 3 and set(parsed.y.tolist()) == {0, 1}
    np.testing.assert_array_equal(
        parse_image_labels(path, fmt="zip", task=None, classes=("light", "dark", "unused"), limits=IngestLimits()),
        parsed.y,
    )
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path, classes=("dark", "cat"))
    assert caught.value.reason == "label-not-in-classes" and "'light'" in caught.value.detail


def test_colour_images_take_three_channels_and_channels_1_converts_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    members = {f"{c}/{i}.png": png(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)) for c in "ab" for i in range(3)}
    path = write(tmp_path, zip_bytes(members))
    assert _parse(path).images.shape == (6, 6, 5, 3)
    grey = _parse(path, channels=1)
    assert grey.images.shape == (6, 6, 5, 1) and image_facts(grey)["feature_shape"] == (1, 6, 5)


def test_jpeg_files_decode_and_image_size_resizes_every_image(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    members = {
        "a/big.jpg": png(rng.integers(0, 256, (20, 16), dtype=np.uint8), fmt="JPEG"),
        "a/small.png": png(rng.integers(0, 256, (7, 9), dtype=np.uint8)),
        "b/x.jpeg": png(rng.integers(0, 256, (12, 12), dtype=np.uint8), fmt="JPEG"),
    }
    path = write(tmp_path, zip_bytes(members))
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path)
    assert caught.value.reason == "mixed-image-sizes" and "image_size=" in caught.value.detail
    resized = _parse(path, size=(10, 8))
    assert resized.images.shape == (3, 10, 8, 1)


def test_macos_junk_is_ignored_and_other_files_are_refused(tmp_path: Path) -> None:
    members = {name: png(pixels) for name, pixels in class_images(2).items()}
    junk = {**members, "__MACOSX/dark/._000.png": b"\x00junk", "dark/.DS_Store": b"\x00", ".DS_Store": b"\x00"}
    assert _parse(write(tmp_path, zip_bytes(junk), name="junk.zip")).images.shape[0] == 4
    with pytest.raises(DatasetValidationError) as caught:
        _parse(write(tmp_path, zip_bytes({**members, "dark/notes.txt": b"hi"}), name="txt.zip"))
    assert caught.value.reason == "not-an-image" and "notes.txt" in caught.value.detail


def test_image_size_accepts_hxw_or_one_side() -> None:
    assert parse_image_size("28") == (28, 28)
    assert parse_image_size("32x24") == (32, 24)
    assert parse_image_size(None) is None
    for bad in ("0", "28x", "x", "9999x2", "-3"):
        with pytest.raises(DatasetValidationError):
            parse_image_size(bad)


def test_a_uint8_npz_is_an_image_dataset_and_a_float_npz_stays_tabular(tmp_path: Path) -> None:
    y = np.arange(10) % 2
    grey = write(tmp_path, npz_bytes(X=np.zeros((10, 4, 5), dtype=np.uint8), y=y), name="grey.npz")
    rgb = write(tmp_path, npz_bytes(X=np.zeros((10, 4, 5, 3), dtype=np.uint8), y=y), name="rgb.npz")
    floats = write(tmp_path, npz_bytes(X=np.zeros((10, 4, 5), dtype=np.float32), y=y), name="f.npz")
    limits = IngestLimits()

    def modality(path: Path, declared: str | None = None) -> str:
        return resolve_modality(path, fmt="npz", declared=declared, options=ImageOptions(), limits=limits)

    assert modality(grey) == modality(rgb) == "image"
    assert modality(floats) == "tabular" and modality(grey, "tabular") == "tabular"
    assert _parse(grey, fmt="npz").images.shape == (10, 4, 5, 1)
    parsed = _parse(rgb, fmt="npz")
    assert parsed.images.shape == (10, 4, 5, 3) and image_facts(parsed)["feature_shape"] == (3, 4, 5)
    np.testing.assert_array_equal(parse_image_labels(rgb, fmt="npz", task=None, classes=("0", "1"), limits=limits), y)
    with pytest.raises(DatasetValidationError) as caught:
        modality(floats, "image")
    assert caught.value.reason == "bad-image-options" and "uint8" in caught.value.detail


# ------------------------------------------------------------------ every image refusal has a case


def _zip_with(members: dict[str, bytes], *, symlink: str | None = None) -> Callable[[Path], Path]:
    def build(directory: Path) -> Path:
        path = directory / "upload.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
            if symlink is not None:
                info = zipfile.ZipInfo(symlink)
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                archive.writestr(info, "/etc/passwd")
        return path

    return build


def _raw(data: bytes) -> Callable[[Path], Path]:
    return lambda directory: write(directory, data, name="upload.zip")


_OK = png(np.zeros((4, 4), dtype=np.uint8))
_TWO = {"a/0.png": _OK, "b/0.png": _OK}


@dataclass(frozen=True)
class Case:
    reason: str
    build: Callable[[Path], Path]
    fmt: str = "zip"
    limits: IngestLimits = field(default_factory=IngestLimits)
    options: ImageOptions = field(default_factory=ImageOptions)
    where: str = ""
    """A substring the detail must contain: what is wrong, or where."""


CASES = [
    Case("invalid-archive", _raw(b"PK\x03\x04 not really a zip"), where="zip archive"),
    Case("bad-archive-path", _zip_with({**_TWO, "../evil/0.png": _OK}), where="../evil"),
    Case("bad-archive-path", _zip_with({**_TWO, "/abs/0.png": _OK}), where="/abs"),
    Case("bad-archive-path", _zip_with(_TWO, symlink="a/link.png"), where="symbolic link"),
    Case("bad-archive-layout", _zip_with({**_TWO, "a/deeper/0.png": _OK}), where="a/deeper/0.png"),
    Case("bad-archive-layout", _zip_with({**_TWO, "top.png": _OK}), where="top.png"),
    Case("too-many-files", _zip_with({**_TWO, "a/1.png": _OK}), limits=IngestLimits(max_image_files=2), where="2"),
    Case("not-an-image", _zip_with({**_TWO, "a/fake.png": b"GIF89a not a png"}), where="a/fake.png"),
    Case("not-an-image", _zip_with({**_TWO, "a/pic.gif": _OK}), where="a/pic.gif"),
    Case(
        "image-too-large",
        _zip_with({"a/0.png": png(np.zeros((64, 64), dtype=np.uint8)), "b/0.png": _OK}),
        limits=IngestLimits(max_image_pixels=1000),
        where="64×64",
    ),
    Case("mixed-image-sizes", _zip_with({"a/0.png": _OK, "b/0.png": png(np.zeros((5, 4), np.uint8))}), where="b/0.png"),
    Case("too-many-pixels", _zip_with(_TWO), limits=IngestLimits(max_image_decode_bytes=31), where="32 pixel values"),
    Case("pixel-amplification", lambda d: write(d, pixel_bomb_zip(5), name="bomb.zip"), where="per byte"),
    Case("bad-image-options", _zip_with(_TWO), options=ImageOptions(channels=2), where="channels"),
    Case(
        "bad-image-options",
        lambda d: write(d, npz_bytes(X=np.zeros((4, 3, 3, 2), np.uint8), y=np.arange(4) % 2), name="x.npz"),
        fmt="npz",
        where="2 channels",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.reason}-{i}" for i, c in enumerate(CASES)])
def test_each_refusal_names_its_reason_and_where(tmp_path: Path, case: Case) -> None:
    with pytest.raises(DatasetValidationError) as caught:
        parse_images(
            case.build(tmp_path), fmt=case.fmt, task=None, classes=None, limits=case.limits, options=case.options
        )
    assert caught.value.reason == case.reason, caught.value.detail
    assert case.where in caught.value.detail


def test_a_decompression_bomb_is_refused_by_pillows_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backs up the header check: an operator limit above Pillow's lets Pillow's guard refuse."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    path = _zip_with({"a/0.png": png(np.zeros((12, 12), dtype=np.uint8)), "b/0.png": _OK})(tmp_path)
    with pytest.raises(DatasetValidationError) as caught:
        parse_images(path, fmt="zip", task=None, classes=None, limits=IngestLimits(), options=ImageOptions())
    assert caught.value.reason == "decompression-bomb"


def test_the_decoded_array_is_bounded_before_it_is_allocated(tmp_path: Path) -> None:
    path = write(tmp_path, image_zip())  # 24 images of 64 bytes
    with pytest.raises(DatasetValidationError) as caught:
        _parse(path, limits=IngestLimits(max_decompressed_bytes=24 * 64 - 1))
    assert caught.value.reason == "too-large-decompressed"


def test_class_folders_beyond_the_class_limit_are_refused_before_decoding(tmp_path: Path) -> None:
    members = {f"c{i}/0.png": b"never decoded" for i in range(4)}
    with pytest.raises(DatasetValidationError) as caught:
        _parse(write(tmp_path, zip_bytes(members)), limits=IngestLimits(max_classes=3))
    assert caught.value.reason == "bad-labels" and "4 class folders" in caught.value.detail


def test_every_image_reason_has_a_case() -> None:
    covered = {case.reason for case in CASES} | {"decompression-bomb"}
    assert covered == set(IMAGE_REASONS)
