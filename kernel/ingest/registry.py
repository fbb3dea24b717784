"""What a format reader must return, and the registry that finds a reader by format name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

import numpy as np

from kernel.ingest.columns import ScalingGroup
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.limits import IngestLimits
from kernel.ingest.preparation import Preparation


@dataclass(frozen=True, eq=False)
class RowPositions:
    """Names a row the way the uploader can find it: a CSV line number, else an array index."""

    line_numbers: np.ndarray | None = None
    """1-based line on which each CSV row starts; None for array formats."""

    def describe(self, row: int) -> str:
        if self.line_numbers is None:
            return f"index {row}"
        return f"line {int(self.line_numbers[row])}"


@dataclass(frozen=True, eq=False)
class TextLabels:
    """The label column's texts, for files whose labels may be words ("benign", "malignant")."""

    codes: np.ndarray | None = field(repr=False)
    """int64 (n,): each row's label as a position in ``distinct``; None when the column holds
    more distinct texts than a class list may have (then they can only be numbers)."""
    distinct: tuple[str, ...] = field(repr=False)
    """The distinct label texts (trimmed), in the order first found."""


@dataclass(frozen=True, eq=False)
class RawLabels:
    """The label column as read, before a task gives it a meaning."""

    numbers: np.ndarray = field(repr=False)
    """float64 (n,): each label as a number; NaN where the label is text, not a number
    (labels that are numbers are always finite: readers refuse the others)."""
    texts: TextLabels | None = None
    """None for array formats, whose labels are always numbers."""

    def first_text(self) -> int | None:
        """The first row whose label is not a number, or None when every label is one."""
        text = np.isnan(self.numbers)
        return int(np.argmax(text)) if text.any() else None


@dataclass(frozen=True, eq=False)
class RawDataset:
    """A reader's output: features are checked, the labels not yet interpreted as a task."""

    X: np.ndarray = field(repr=False)
    """float32, finite, shape (n, *feature_shape); dropped and one-hot columns already applied,
    the declared scaling not yet."""
    labels: RawLabels
    feature_names: tuple[str, ...] | None
    rows: RowPositions
    scaling: tuple[ScalingGroup, ...] = ()
    """The declared scaling of the features, for the caller to apply."""
    units: np.ndarray | None = field(default=None, repr=False)
    """int64 (n,): each row's privacy unit as an index 0 .. n_units - 1 (in order of first
    appearance); None when the privacy unit is one row."""


class Reader(Protocol):
    def __call__(
        self,
        path: Path,
        *,
        label_column: str | None,
        limits: IngestLimits,
        preparation: Preparation | None,
        unit_column: str | None,
    ) -> RawDataset: ...


ReaderT = TypeVar("ReaderT", bound=Reader)

_READERS: dict[str, Reader] = {}


def register_reader(fmt: str) -> Callable[[ReaderT], ReaderT]:
    """Class-free plug-in point: a new format is one decorated function, no dispatch to edit."""

    def register(reader: ReaderT) -> ReaderT:
        if fmt in _READERS:
            raise ValueError(f"a reader for format {fmt!r} is already registered")
        _READERS[fmt] = reader
        return reader

    return register


def supported_formats() -> tuple[str, ...]:
    return tuple(sorted(_READERS))


def get_reader(fmt: str) -> Reader:
    try:
        return _READERS[fmt]
    except KeyError:
        raise DatasetValidationError(
            "unknown-format",
            f"the format is not supported; use one of: {', '.join(supported_formats())}",
        ) from None
