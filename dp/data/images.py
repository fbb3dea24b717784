"""An image dataset's decoded uint8 array, memory-mapped and normalised batch by batch.

The API stores each image dataset once as a uint8 .npy array (n, H, W, C) (kernel/datasets/image_arrays.py).
The worker opens it with ``np.load(..., mmap_mode="r")`` (never unpickling anything), so only
the rows a batch touches are read from disk, and converts them to what the models take:
float32 x / 255 in the (C, H, W) channel layout. The normalisation is a fixed public map of
each image, so it costs no privacy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


class ImageRows:
    """A read-only, memory-mapped image array that hands out normalised float batches."""

    def __init__(self, path: Path, *, shape: tuple[int, int, int] | None = None) -> None:
        """``shape``: the dataset's public (C, H, W), checked against the file's header."""
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if not isinstance(array, np.ndarray) or array.dtype != np.uint8 or array.ndim != 4:
            raise ValueError(f"{path.name} is not a uint8 (n, H, W, C) image array")
        if shape is not None and (array.shape[3], array.shape[1], array.shape[2]) != tuple(shape):
            raise ValueError(f"{path.name} holds images of shape {array.shape[1:]}, not the dataset's {shape}")
        self._array = array

    @property
    def n_rows(self) -> int:
        return int(self._array.shape[0])

    @property
    def model_shape(self) -> tuple[int, int, int]:
        """(C, H, W)."""
        _n, height, width, channels = self._array.shape
        return int(channels), int(height), int(width)

    @property
    def nbytes(self) -> int:
        return int(self._array.nbytes)

    def raw(self, index: np.ndarray | slice) -> np.ndarray:
        """The uint8 (b, H, W, C) rows at ``index``: a writable copy of just those rows."""
        return np.array(self._array[index])

    def batch(self, index: np.ndarray | slice) -> torch.Tensor:
        """The rows at ``index`` as float32 (b, C, H, W) in [0, 1]; reads only those rows."""
        return normalise(self.raw(index))


def normalise(images: np.ndarray) -> torch.Tensor:
    """uint8 (b, H, W, C) → float32 (b, C, H, W) holding x / 255."""
    batch = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    return batch.to(torch.float32).div_(255.0).contiguous()
