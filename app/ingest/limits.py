"""Size limits for an upload, applied before the data is held in memory where possible."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class IngestLimits:
    """Caps on what one upload may contain; they bound the memory and time a parse can take."""

    max_rows: int = 1_000_000
    max_features: int = 100_000
    """Product of the feature shape (CSV: columns minus the label column)."""
    max_field_chars: int = 256
    """Characters in one CSV field, header names included."""
    max_decompressed_bytes: int = 2 * 1024**3
    """Sum of the NPZ members' declared uncompressed sizes."""
    max_classes: int = 1000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"IngestLimits.{field.name} must be a positive integer")
