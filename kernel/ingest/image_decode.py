"""Decoding one uploaded PNG/JPEG with Pillow, bounded before and while it decodes.

An image file is untrusted: a few KB of PNG can declare a gigapixel canvas. Its size is read
from the header (:func:`read_image_header`, no pixel decoded) and checked against
``max_image_pixels`` before any pixel is decoded; Pillow's own decompression-bomb guard
(``Image.MAX_IMAGE_PIXELS``, its warning turned into an error) backs that up while decoding.
Only the PNG and JPEG decoders are ever tried, and whatever they raise on crafted bytes is a
refusal naming the file.
"""

from __future__ import annotations

import io
import warnings
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

import numpy as np
from PIL import Image

from kernel.ingest.errors import DatasetValidationError

DECODERS = ("PNG", "JPEG")
"""The only Pillow formats an upload may use: no TIFF, BMP, EPS or anything with a plug-in."""

RESAMPLING = Image.Resampling.BILINEAR
"""The fixed, public filter used when the owner asks for ``image_size=``."""

_GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F"})


@dataclass(frozen=True)
class DecodeRules:
    """How every image of one dataset is decoded: same mode, and either the same size or resized."""

    max_pixels: int
    channels: int | None
    """1 (mode L) or 3 (RGB); None: taken from the first image."""
    size: tuple[int, int] | None
    """(height, width) to resize to; None: every image must have the first image's size."""


def channels_of(image: Image.Image) -> int:
    """1 for a grey image, 3 for anything in colour (palette images included)."""
    return 1 if image.mode in _GREY_MODES else 3


@dataclass(frozen=True)
class ImageHeader:
    """What an image file declares in its header, read before any pixel is decoded."""

    width: int
    height: int
    channels: int
    """1 or 3: what the image becomes when no ``channels=`` is declared (:func:`channels_of`)."""
    bands: int
    """Values per pixel its decoder produces (4 for RGBA, 1 for a palette image)."""

    def decoded_values(self, *, channels: int | None) -> int:
        """Width × height × channels: what decoding it produces, in its own mode or converted to
        ``channels`` (its own when None), whichever is larger."""
        return self.width * self.height * max(self.bands, channels or self.channels)


def read_image_header(stream: IO[bytes], *, name: str, max_pixels: int) -> ImageHeader:
    """The image's size and mode from its header alone: Pillow's ``open`` reads the header and no
    pixel data (nothing is decoded until ``load``). Refuses what is not a PNG/JPEG or declares more
    than ``max_pixels`` pixels."""
    with _refusing_bad_images(name, max_pixels=max_pixels), Image.open(stream, formats=DECODERS) as image:
        width, height = image.size
        _check_pixels(width, height, name=name, max_pixels=max_pixels)
        return ImageHeader(width=width, height=height, channels=channels_of(image), bands=len(image.getbands()))


def decode_image(data: bytes, *, name: str, rules: DecodeRules) -> np.ndarray:
    """The image in ``data`` as uint8 (H, W, C) with C = ``rules.channels`` (or its own), resized
    to ``rules.size`` when given; refuses what is not a PNG/JPEG or is too large to decode."""
    with (
        _refusing_bad_images(name, max_pixels=rules.max_pixels),
        Image.open(io.BytesIO(data), formats=DECODERS) as image,
    ):
        width, height = image.size
        _check_pixels(width, height, name=name, max_pixels=rules.max_pixels)
        channels = rules.channels if rules.channels is not None else channels_of(image)
        converted = image.convert("L" if channels == 1 else "RGB")
        if rules.size is not None and (height, width) != rules.size:
            converted = converted.resize((rules.size[1], rules.size[0]), RESAMPLING)
        pixels = np.asarray(converted, dtype=np.uint8)
    return pixels[:, :, np.newaxis] if pixels.ndim == 2 else pixels


def _check_pixels(width: int, height: int, *, name: str, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise DatasetValidationError(
            "image-too-large", f"{name} is {width}×{height} pixels; the limit is {max_pixels} pixels per image"
        )


@contextmanager
def _refusing_bad_images(name: str, *, max_pixels: int) -> Iterator[None]:
    """Pillow's decompression-bomb warning as an error, and every failure of a decoder on
    untrusted bytes as a refusal naming the file (never a 500)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except (DatasetValidationError, MemoryError):
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise DatasetValidationError(
            "decompression-bomb", f"{name} declares more pixels than may be decoded ({max_pixels})"
        ) from exc
    except (zipfile.BadZipFile, zlib.error) as exc:
        raise DatasetValidationError("invalid-archive", f"member {name} is truncated or corrupt") from exc
    except Exception as exc:
        # A decoder fed crafted bytes may raise anything (struct.error, IndexError, ZeroDivisionError,
        # ... beside the documented OSError and SyntaxError).
        raise DatasetValidationError("not-an-image", f"{name} is not a readable PNG or JPEG image") from exc
