"""ZIP of class folders (``class_name/any_name.png``): checked from the directory, then decoded.

The archive is untrusted. Its directory is checked before any member is read: every path is one
folder deep, relative, without ``..``, not a symlink; only .png/.jpg/.jpeg files (the junk that
macOS archivers add, ``__MACOSX/`` and ``.DS_Store``, is ignored; anything else is refused); at
most ``max_image_files`` images; the declared sizes bounded like an NPZ's. Then every image's
header is read (no pixel decoded): each image's pixels, and the pixels of all of them together
(absolutely and relative to the upload's size: a 16 KB PNG of zeros declares 16 M pixels), are
bounded, and the images' sizes must agree. Only then is each image decoded under the limits of
kernel/ingest/image_decode.py into one preallocated uint8 array, whose size (n × H × W × C) is
checked against ``max_decompressed_bytes`` before it is allocated. The parse stops between
members when its deadline passes or its client leaves (kernel/ingest/parse_control.py).
"""

from __future__ import annotations

import math
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.image_decode import DecodeRules, ImageHeader, decode_image, read_image_header
from kernel.ingest.limits import IngestLimits
from kernel.ingest.parse_control import checkpoint

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg"})
IGNORED_FOLDERS = frozenset({"__MACOSX"})
IGNORED_FILES = frozenset({".DS_Store"})
_SAFE_COMPRESSION = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_ENCRYPTED_FLAG = 0x1
_READ_ERRORS = (ValueError, EOFError, OSError, NotImplementedError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True, eq=False)
class FolderImages:
    """The decoded images and the folder (class name) each came from."""

    images: np.ndarray = field(repr=False)
    """uint8 (n, H, W, C), in the archive's sorted path order."""
    folders: tuple[str, ...]
    """The sorted distinct folder names."""
    folder_index: np.ndarray = field(repr=False)
    """int64 (n,): each image's position in ``folders``."""


def read_image_zip(path: Path, *, limits: IngestLimits, rules: DecodeRules) -> FolderImages:
    """Decode a class-folder ZIP, or raise DatasetValidationError naming the offending member.

    Every image's header is read, and every limit on sizes checked, before the first is decoded."""
    compressed_bytes = path.stat().st_size
    archive = _open(path)
    with archive:
        members = _image_members(archive, limits=limits, compressed_bytes=compressed_bytes)
        folders, folder_index = _folders_of(members)
        if len(folders) > limits.max_classes:  # before decoding anything
            raise DatasetValidationError(
                "bad-labels", f"the archive has {len(folders)} class folders; the limit is {limits.max_classes}"
            )
        headers = _read_headers(archive, members, max_pixels=rules.max_pixels)
        _check_decode_budget(headers, channels=rules.channels, limits=limits, compressed_bytes=compressed_bytes)
        shape = _decoded_shape(members, headers, rules=rules)
        images = _allocate(len(members), shape, limits=limits)
        rules = DecodeRules(max_pixels=rules.max_pixels, channels=shape[2], size=rules.size)
        for row, info in enumerate(members):
            checkpoint()
            decoded = _decode(archive, info, rules=rules)
            if decoded.shape != shape:  # the header promised otherwise
                raise DatasetValidationError(
                    "not-an-image", f"{info.filename!r} decodes to a different size than its header declares"
                )
            images[row] = decoded
    return FolderImages(images=images, folders=folders, folder_index=folder_index)


def _read_headers(archive: zipfile.ZipFile, members: list[zipfile.ZipInfo], *, max_pixels: int) -> list[ImageHeader]:
    """Each image's size and mode from its header; only the first few KB of each are inflated."""
    headers = []
    for info in members:
        checkpoint()
        try:
            with archive.open(info) as member:
                headers.append(read_image_header(member, name=repr(info.filename), max_pixels=max_pixels))
        except DatasetValidationError:  # a ValueError, as some of _READ_ERRORS are
            raise
        except _READ_ERRORS as exc:
            raise DatasetValidationError(
                "invalid-archive", f"member {info.filename!r} is truncated or corrupt"
            ) from exc
    return headers


def _check_decode_budget(
    headers: list[ImageHeader], *, channels: int | None, limits: IngestLimits, compressed_bytes: int
) -> None:
    """The declared pixels of all images together, bounded absolutely and relative to the upload's
    size: each image may be within ``max_image_pixels`` and their sum still take minutes to decode."""
    allowance, reason, wording = limits.image_decode_allowance(compressed_bytes=compressed_bytes)
    declared = sum(header.decoded_values(channels=channels) for header in headers)
    if declared > allowance:
        raise DatasetValidationError(
            reason,
            f"the archive's {len(headers)} images declare {declared} pixel values (width × height × channels, "
            f"from their headers); the limit is {wording}. Resize the images closer to the size you train on "
            "before uploading",
        )


def _decoded_shape(
    members: list[zipfile.ZipInfo], headers: list[ImageHeader], *, rules: DecodeRules
) -> tuple[int, int, int]:
    """(H, W, C) of every decoded image: the declared size and channels, else the first image's;
    without ``image_size=`` every image must have the first one's size."""
    first = headers[0]
    channels = rules.channels if rules.channels is not None else first.channels
    if rules.size is not None:
        return rules.size[0], rules.size[1], channels
    for info, header in zip(members, headers, strict=True):
        if (header.width, header.height) != (first.width, first.height):
            raise DatasetValidationError(
                "mixed-image-sizes",
                f"{info.filename} is {header.width}×{header.height} pixels but {members[0].filename} "
                f"is {first.width}×{first.height}; give image_size= to resize them all to one size",
            )
    return first.height, first.width, channels


def zip_folder_labels(path: Path, *, limits: IngestLimits) -> tuple[tuple[str, ...], np.ndarray]:
    """The sorted folder names and each image's folder, from the directory alone (no decoding):
    the worker's labels, in the same order as the decoded array's rows."""
    with _open(path) as archive:
        members = _image_members(archive, limits=limits, compressed_bytes=path.stat().st_size)
    return _folders_of(members)


def _folders_of(members: list[zipfile.ZipInfo]) -> tuple[tuple[str, ...], np.ndarray]:
    folder_names = [PurePosixPath(info.filename).parts[0] for info in members]
    folders = tuple(sorted(set(folder_names)))
    position = {name: index for index, name in enumerate(folders)}
    return folders, np.array([position[name] for name in folder_names], dtype=np.int64)


def _open(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise DatasetValidationError("invalid-archive", "the file is not a readable zip archive") from exc


def _is_junk(parts: tuple[str, ...]) -> bool:
    return parts[0] in IGNORED_FOLDERS or parts[-1] in IGNORED_FILES


def _check_path(info: zipfile.ZipInfo) -> tuple[str, ...]:
    """The member's path parts, refusing anything that could escape or hide what it is."""
    name = info.filename
    path = PurePosixPath(name)
    if name.startswith("/") or "\\" in name or ":" in name or ".." in path.parts or "\x00" in name:
        raise DatasetValidationError(
            "bad-archive-path", f"member {name!r} has an absolute or parent (..) path; only class_name/file paths"
        )
    if stat.S_ISLNK(info.external_attr >> 16):
        raise DatasetValidationError("bad-archive-path", f"member {name!r} is a symbolic link")
    return path.parts


def _image_members(archive: zipfile.ZipFile, *, limits: IngestLimits, compressed_bytes: int) -> list[zipfile.ZipInfo]:
    members: list[zipfile.ZipInfo] = []
    declared = 0
    allowance, wording = limits.decompressed_allowance(compressed_bytes=compressed_bytes)
    for info in archive.infolist():
        parts = _check_path(info)
        if _is_junk(parts):
            continue
        if info.is_dir():
            if len(parts) > 1:
                raise DatasetValidationError(
                    "bad-archive-layout", f"folder {info.filename!r} is nested; use exactly one folder per class"
                )
            continue
        if len(parts) != 2:
            raise DatasetValidationError(
                "bad-archive-layout",
                f"member {info.filename!r} is not inside exactly one class folder (class_name/image.png)",
            )
        if PurePosixPath(parts[1]).suffix.lower() not in IMAGE_SUFFIXES:
            raise DatasetValidationError("not-an-image", f"member {info.filename!r} is not a .png, .jpg or .jpeg file")
        if info.flag_bits & _ENCRYPTED_FLAG or info.compress_type not in _SAFE_COMPRESSION:
            raise DatasetValidationError(
                "invalid-archive", f"member {info.filename!r} is encrypted or uses an unsupported compression method"
            )
        members.append(info)
        if len(members) > limits.max_image_files:
            raise DatasetValidationError(
                "too-many-files", f"the archive holds more than {limits.max_image_files} image files"
            )
        declared += info.file_size
        if declared > allowance:
            raise DatasetValidationError("too-large-decompressed", f"the archive's images declare more than {wording}")
    if len(members) > limits.max_rows:
        raise DatasetValidationError(
            "too-many-rows", f"the archive holds {len(members)} images; the limit is {limits.max_rows}"
        )
    if not members:
        raise DatasetValidationError(
            "empty-dataset", "the archive holds no .png, .jpg or .jpeg image in a class folder"
        )
    return sorted(members, key=lambda info: info.filename)


def _decode(archive: zipfile.ZipFile, info: zipfile.ZipInfo, *, rules: DecodeRules) -> np.ndarray:
    try:
        with archive.open(info) as member:
            data = member.read(info.file_size + 1)
    except _READ_ERRORS as exc:
        raise DatasetValidationError("invalid-archive", f"member {info.filename!r} is truncated or corrupt") from exc
    if len(data) > info.file_size:
        raise DatasetValidationError("invalid-archive", f"member {info.filename!r} holds more than it declares")
    return decode_image(data, name=repr(info.filename), rules=rules)


def _allocate(n_images: int, shape: tuple[int, ...], *, limits: IngestLimits) -> np.ndarray:
    """The dataset's uint8 array, refused before allocation when it would pass the limits."""
    per_image = math.prod(shape)
    if per_image > limits.max_features:
        raise DatasetValidationError(
            "too-many-columns",
            f"one image is {shape[1]}×{shape[0]}×{shape[2]} = {per_image} values; the limit is {limits.max_features}",
        )
    total = n_images * per_image
    if total > limits.max_decompressed_bytes:
        raise DatasetValidationError(
            "too-large-decompressed",
            f"{n_images} images of {per_image} bytes decode to {total} bytes; the limit is "
            f"{limits.max_decompressed_bytes} bytes (resize them with image_size=)",
        )
    return np.empty((n_images, *shape), dtype=np.uint8)
