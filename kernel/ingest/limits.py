"""Size limits for an upload, applied before the data is held in memory where possible."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kernel.config import Settings

ImageBudgetReason = Literal["too-many-pixels", "pixel-amplification"]
"""Which bound on a ZIP's declared pixels refused it: the absolute one, or the one relative to its size."""

RATIO_FREE_BYTES = 64 * 1024**2
"""Decompressed bytes any NPZ may reach whatever its compression ratio: small, very regular
arrays (one-hot labels, blank images) compress far better than 200×, and 64 MiB is cheap to parse."""


@dataclass(frozen=True)
class IngestLimits:
    """Caps on what one upload may contain; they bound the memory and time a parse can take."""

    max_rows: int = 1_000_000
    max_features: int = 100_000
    """Product of the feature shape (CSV: columns minus the label column)."""
    max_field_chars: int = 256
    """Characters in one CSV field, header names included."""
    max_header_chars: int = 2_000_000
    """Characters in all the CSV header's names together. The feature names are stored with the
    dataset and returned in its full view, so this bounds that view at a few MB: 100,000 columns
    of 20 characters fit, 100,000 of 256 (25.6 million characters) do not."""
    max_decompressed_bytes: int = 1024**3
    """Sum of the NPZ members' uncompressed sizes. Parsing holds the arrays and their float32
    copy, about twice this, so 1 GiB keeps a few concurrent uploads well inside a 24 GiB machine
    while still admitting 1e6 rows × 266 float32 features or MNIST-sized uint8 images. (The
    product max_rows × max_features × 4 bytes, 400 GB, could never be held, hence its own cap.)"""
    max_compression_ratio: int = 200
    """NPZ uncompressed bytes per byte on disk, above RATIO_FREE_BYTES: bounds the work a small
    upload can cause (a 2 MB file declaring 2 GiB is 1000×; real numeric data is far below 200×)."""
    max_classes: int = 1000
    max_image_files: int = 200_000
    """Image files in one ZIP upload (each one decoded row)."""
    max_image_pixels: int = 16_777_216
    """Width × height of one uploaded image (4096 × 4096), checked from its header before it is
    decoded; Pillow's decompression-bomb guard applies the same bound while decoding."""
    max_image_decode_bytes: int = 4 * 1024**3
    """Width × height × channels summed over a ZIP's images, read from their headers before any
    is decoded: bounds the decoding work, which resizing (``image_size=``) hides from the size of
    the decoded array (a ZIP of 4096 × 4096 PNGs resized to 8 × 8 decodes 16 M values per image
    into a 64-value row)."""
    max_image_decode_ratio: int = 200
    """Decoded values (as above) per byte of the upload, above RATIO_FREE_BYTES: a 16 KB PNG of
    zeros declares 16 M pixels, 1000× its size; photographs decode to 2–30× theirs."""
    max_text_records: int = 1_000_000
    """Records (non-blank lines) in one JSON Lines upload."""
    max_text_line_bytes: int = 1_048_576
    """Bytes in one JSON Lines line: bounds what one ``json.loads`` may hold and take."""
    max_text_length: int = 4096
    """The largest ``max_length`` (tokens a text row keeps) an upload may declare."""
    max_tokenizer_vocab: int = 262_144
    """Tokens a tokenizer may have (uploaded or trained); token ids are stored as uint16 up to
    65,535 and as int32 above."""
    max_tokenizer_bytes: int = 64 * 1024**2
    """Bytes of an uploaded tokenizer.json, checked before it is read (the largest public ones are
    a few tens of MB)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"IngestLimits.{field.name} must be a positive integer")

    @classmethod
    def from_settings(cls, settings: Settings) -> IngestLimits:
        """The service's limits: the API that admits an upload and the worker that re-reads it
        must apply the same ones, or a dataset the API accepted could fail in the worker."""
        return cls(
            max_rows=settings.max_rows,
            max_features=settings.max_features,
            max_decompressed_bytes=settings.max_decompressed_bytes,
            max_compression_ratio=settings.max_compression_ratio,
            max_image_files=settings.max_image_files,
            max_image_pixels=settings.max_image_pixels,
            max_image_decode_bytes=settings.max_image_decode_bytes,
            max_image_decode_ratio=settings.max_image_decode_ratio,
            max_text_records=settings.max_text_records,
            max_text_line_bytes=settings.max_text_line_bytes,
            max_text_length=settings.max_text_length,
            max_tokenizer_vocab=settings.max_tokenizer_vocab,
            max_tokenizer_bytes=settings.max_tokenizer_bytes,
        )

    def decompressed_allowance(self, *, compressed_bytes: int) -> tuple[int, str]:
        """The most bytes an NPZ of ``compressed_bytes`` may inflate to, and the limit's wording."""
        by_ratio = max(self.max_compression_ratio * compressed_bytes, RATIO_FREE_BYTES)
        if by_ratio < self.max_decompressed_bytes:
            return by_ratio, (
                f"{by_ratio} bytes for an upload of {compressed_bytes} bytes (the compression "
                f"ratio limit is {self.max_compression_ratio}, above {RATIO_FREE_BYTES} bytes)"
            )
        return self.max_decompressed_bytes, f"{self.max_decompressed_bytes} bytes"

    def image_decode_allowance(self, *, compressed_bytes: int) -> tuple[int, ImageBudgetReason, str]:
        """The most values a ZIP of ``compressed_bytes`` may decode its images to, the reason a
        refusal gives (which limit binds) and the limit's wording."""
        by_ratio = max(self.max_image_decode_ratio * compressed_bytes, RATIO_FREE_BYTES)
        if by_ratio < self.max_image_decode_bytes:
            return (
                by_ratio,
                "pixel-amplification",
                (
                    f"{by_ratio} values for an upload of {compressed_bytes} bytes (at most "
                    f"{self.max_image_decode_ratio} per byte, above {RATIO_FREE_BYTES})"
                ),
            )
        return self.max_image_decode_bytes, "too-many-pixels", f"{self.max_image_decode_bytes} values"
