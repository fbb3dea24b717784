"""Decoding one uploaded PNG/JPEG with Pillow, bounded before and while it decodes.

An image file is untrusted: a few KB of PNG can declare a gigapixel canvas. Its size is read
from the header and checked against ``max_image_pixels`` before any pixel is decoded; Pillow's
own decompression-bomb guard (``Image.MAX_IMAGE_PIXELS``, its warning turned into an error)
backs that up while decoding. Only the PNG and JPEG decoders are ever tried.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from app.ingest.errors import DatasetValidationError

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


def decode_image(data: bytes, *, name: str, rules: DecodeRules) -> np.ndarray:
    """The image in ``data`` as uint8 (H, W, C) with C = ``rules.channels`` (or its own), resized
    to ``rules.size`` when given; refuses what is not a PNG/JPEG or is too large to decode."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=DECODERS) as image:
                width, height = image.size
                if width * height > rules.max_pixels:
                    raise DatasetValidationError(
                        "image-too-large",
                        f"{name} is {width}×{height} pixels; the limit is {rules.max_pixels} pixels per image",
                    )
                channels = rules.channels if rules.channels is not None else channels_of(image)
                converted = image.convert("L" if channels == 1 else "RGB")
                if rules.size is not None and (height, width) != rules.size:
                    converted = converted.resize((rules.size[1], rules.size[0]), RESAMPLING)
                pixels = np.asarray(converted, dtype=np.uint8)
    except DatasetValidationError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise DatasetValidationError(
            "decompression-bomb", f"{name} declares more pixels than may be decoded ({rules.max_pixels})"
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise DatasetValidationError("not-an-image", f"{name} is not a readable PNG or JPEG image") from exc
    return pixels[:, :, np.newaxis] if pixels.ndim == 2 else pixels
