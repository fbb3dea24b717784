"""Array helpers shared by the readers and the label checks."""

from __future__ import annotations

import numpy as np


def as_float32(array: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy; overflow becomes inf, which callers report as non-finite."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ascontiguousarray(array, dtype=np.float32)


def first_non_finite(array: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first NaN or ±inf in C order: an error can point at a cell, not show it."""
    finite = np.isfinite(array)
    if finite.all():
        return None
    first = int(np.argmin(finite.ravel()))
    return tuple(int(i) for i in np.unravel_index(first, array.shape))


def first_true(mask: np.ndarray) -> int | None:
    """Position of the first True in a 1-D mask, or None."""
    if not mask.any():
        return None
    return int(np.argmax(mask))
