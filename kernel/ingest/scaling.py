"""Applies the owner's declared feature scaling to a feature matrix, in place.

Only declared constants enter the transform, never statistics of the rows, so the scaled features
are a public function of each row on its own (neighbours stay neighbours): no privacy cost
(docs/privacy-model.md §2). Values beyond declared bounds are clipped to them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kernel.ingest.columns import ScalingGroup
from kernel.ingest.preparation import MinMax, Scaling, Standardise

CHUNK_ROWS = 65_536
"""Rows scaled at a time: the float64 working copy stays a few MB whatever n is."""


def _min_max(values: np.ndarray, scaling: Scaling) -> np.ndarray:
    assert isinstance(scaling, MinMax)
    low, high = scaling.target
    unit = (np.clip(values, scaling.low, scaling.high) - scaling.low) / (scaling.high - scaling.low)
    scaled: np.ndarray = low + unit * (high - low)
    return scaled


def _standardise(values: np.ndarray, scaling: Scaling) -> np.ndarray:
    assert isinstance(scaling, Standardise)
    return (values - scaling.center) / scaling.scale


_APPLY: dict[type, Callable[[np.ndarray, Scaling], np.ndarray]] = {
    MinMax: _min_max,
    Standardise: _standardise,
}


def apply_scaling(X: np.ndarray, groups: Sequence[ScalingGroup]) -> None:
    """Scale ``X`` (float32, C-contiguous, any shape (n, ...)) in place.

    Computed in float64 and stored as float32: a standardised value too large for float32
    becomes ±inf, which the caller refuses as non-finite.
    """
    flat = X.reshape(X.shape[0], -1)  # a view: X is C-contiguous
    for group in groups:
        apply = _APPLY[type(group.scaling)]
        for start in range(0, flat.shape[0], CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            block = flat[rows] if group.features is None else flat[rows][:, group.features]
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = apply(block.astype(np.float64), group.scaling).astype(np.float32)
            if group.features is None:
                flat[rows] = scaled
            else:
                flat[rows, group.features] = scaled
