"""The one exception type ingestion raises, with a stable code the API can map to problem+json."""

from __future__ import annotations

from typing import Literal, get_args

TabularReason = Literal[
    "unknown-format",
    "missing-label-column",
    "duplicate-column",
    "ragged-row",
    "non-numeric",
    "empty-field",
    "non-finite",
    "field-too-long",
    "bad-encoding",
    "too-many-rows",
    "too-many-columns",
    "header-too-long",
    "empty-dataset",
    "invalid-npz",
    "missing-array",
    "too-large-decompressed",
    "shape-mismatch",
    "bad-labels",
    "unknown-task",
    "malformed-csv",
    "bad-class-list",
    "label-not-in-classes",
    "ambiguous-task",
    "bad-preparation",
    "unknown-category",
    "missing-privacy-unit-column",
    "bad-privacy-unit-column",
    "missing-privacy-unit",
    "privacy-unit-unsupported-format",
]

ImageReason = Literal[
    "invalid-archive",
    "bad-archive-path",
    "bad-archive-layout",
    "too-many-files",
    "not-an-image",
    "image-too-large",
    "decompression-bomb",
    "too-many-pixels",
    "pixel-amplification",
    "mixed-image-sizes",
    "bad-image-options",
]
"""Refusals of image uploads (kernel/ingest/images.py): ZIP layout, decoding and image limits."""

Reason = Literal[TabularReason, ImageReason]

REASONS: tuple[Reason, ...] = get_args(Reason)
IMAGE_REASONS: tuple[ImageReason, ...] = get_args(ImageReason)


class DatasetValidationError(ValueError):
    """An upload the service refuses.

    ``reason`` is machine-readable and stable; ``detail`` tells the uploader where the problem
    is (line, column name, array index) but never echoes a cell value, because values are the
    private data this service exists to protect and details end up in responses and logs.
    """

    reason: Reason
    detail: str

    def __init__(self, reason: Reason, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown dataset validation reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[DatasetValidationError], tuple[Reason, str]]:
        """Rebuild from (reason, detail) so the error survives pickling across processes."""
        return (type(self), (self.reason, self.detail))
