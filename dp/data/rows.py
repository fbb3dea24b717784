"""A job's feature rows, read batch by batch: where they live is decided once, per job.

The trainers never hold a dataset as one float tensor. They ask a :class:`Rows` for the rows a
step sampled (``take``), and get float32 features on the training device. Three placements:

* :class:`TensorRows` — a tensor already in memory (numeric CSV/NPZ datasets, tests). On a GPU
  worker it is copied to the device once, so a step indexes device memory only.
* :class:`DeviceImageRows` — an image dataset's compact uint8 array copied to the GPU once
  (4× smaller than float32); each batch is gathered and normalised there. Together with Poisson
  sampling on the device (the job's SecureRandom lives there), a step makes no host round-trip
  for its data.
* :class:`MappedImageRows` — the uint8 array memory-mapped from disk: only the rows a batch
  touches are read, so a dataset larger than the machine's RAM (or than the GPU's memory) trains;
  the operating system's page cache keeps what fits.

:func:`place_image_rows` picks between the last two from the dataset's size and the device's
memory. A hold-out split is a :class:`SubsetRows` view: the held-out rows are never copied.
Normalisation (x / 255) is a fixed public map of each image: no privacy cost.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from dp.data.images import ImageRows, normalise

__all__ = [
    "DeviceImageRows",
    "MappedImageRows",
    "Rows",
    "SubsetRows",
    "TensorRows",
    "as_rows",
    "iter_row_chunks",
    "materialise",
    "place_image_rows",
]

COPY_CHUNK_ROWS = 4096
"""Rows copied to the device at a time when a dataset is placed there (bounds the host copy)."""


@runtime_checkable
class Rows(Protocol):
    """Feature rows by index: ``take(index)`` returns float32 rows on ``device``, in index order."""

    @property
    def n_rows(self) -> int: ...

    @property
    def device(self) -> torch.device:
        """Where ``take`` returns its rows (the training device)."""
        ...

    @property
    def row_shape(self) -> tuple[int, ...]: ...

    def take(self, index: torch.Tensor) -> torch.Tensor: ...


class TensorRows:
    """Rows of an in-memory tensor, moved to ``device`` once (a no-op on the CPU)."""

    def __init__(self, X: torch.Tensor, *, device: torch.device | str | None = None) -> None:
        self._X = X if device is None else X.to(device)

    @property
    def n_rows(self) -> int:
        return int(self._X.shape[0])

    @property
    def device(self) -> torch.device:
        return self._X.device

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self._X.shape[1:])

    @property
    def tensor(self) -> torch.Tensor:
        return self._X

    def take(self, index: torch.Tensor) -> torch.Tensor:
        return self._X[index.to(self._X.device)]


class DeviceImageRows:
    """An image dataset's uint8 (n, H, W, C) array resident on the device; batches are gathered
    and normalised there."""

    def __init__(self, images: torch.Tensor) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError("DeviceImageRows holds a uint8 (n, H, W, C) tensor")
        self._images = images

    @classmethod
    def copy_of(cls, rows: ImageRows, device: torch.device) -> DeviceImageRows:
        """Copy a memory-mapped array to ``device`` chunk by chunk (the host never holds it whole)."""
        channels, height, width = rows.model_shape
        out = torch.empty((rows.n_rows, height, width, channels), dtype=torch.uint8, device=device)
        for start in range(0, rows.n_rows, COPY_CHUNK_ROWS):
            chunk = torch.from_numpy(rows.raw(slice(start, start + COPY_CHUNK_ROWS)))
            out[start : start + chunk.shape[0]].copy_(chunk)
        return cls(out)

    @property
    def n_rows(self) -> int:
        return int(self._images.shape[0])

    @property
    def device(self) -> torch.device:
        return self._images.device

    @property
    def row_shape(self) -> tuple[int, ...]:
        _n, height, width, channels = self._images.shape
        return int(channels), int(height), int(width)

    def take(self, index: torch.Tensor) -> torch.Tensor:
        batch = self._images[index.to(self.device)].permute(0, 3, 1, 2)
        return batch.to(torch.float32).div_(255.0).contiguous()


class MappedImageRows:
    """A memory-mapped uint8 image array: each batch reads only its rows from disk, normalises
    them on the host and moves them to ``device`` (through pinned memory on a GPU)."""

    def __init__(self, rows: ImageRows, *, device: torch.device | str = "cpu") -> None:
        self._rows = rows
        self._device = torch.device(device)

    @property
    def n_rows(self) -> int:
        return self._rows.n_rows

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self._rows.model_shape

    def take(self, index: torch.Tensor) -> torch.Tensor:
        positions = index.to("cpu", torch.int64).numpy()
        batch = normalise(self._rows.raw(positions))
        if self._device.type == "cuda":
            return batch.pin_memory().to(self._device, non_blocking=True)
        return batch.to(self._device)


class SubsetRows:
    """The rows of ``base`` at ``positions`` (e.g. the training part of a hold-out split)."""

    def __init__(self, base: Rows, positions: np.ndarray) -> None:
        self._base = base
        self._positions = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(base.device)

    @property
    def n_rows(self) -> int:
        return int(self._positions.shape[0])

    @property
    def device(self) -> torch.device:
        return self._base.device

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self._base.row_shape

    def take(self, index: torch.Tensor) -> torch.Tensor:
        return self._base.take(self._positions[index.to(self._positions.device)])


def as_rows(X: torch.Tensor | Rows) -> Rows:
    """A tensor as TensorRows (left where it is); a Rows unchanged."""
    return TensorRows(X) if isinstance(X, torch.Tensor) else X


def place_image_rows(rows: ImageRows, device: torch.device, *, max_device_fraction: float) -> Rows:
    """On a GPU, the whole uint8 array on the device when it takes at most ``max_device_fraction``
    of the device's memory (the rest is for the model, activations and per-sample work); otherwise,
    and on the CPU, memory-mapped."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if rows.nbytes <= max_device_fraction * total:
            return DeviceImageRows.copy_of(rows, device)
    return MappedImageRows(rows, device=device)


def iter_row_chunks(rows: Rows, *, chunk_rows: int) -> list[torch.Tensor]:
    """Consecutive index ranges covering every row, on the rows' device (for evaluation passes)."""
    return [
        torch.arange(start, min(start + chunk_rows, rows.n_rows), device=rows.device)
        for start in range(0, rows.n_rows, chunk_rows)
    ]


def materialise(rows: Rows, *, chunk_rows: int = 4096) -> torch.Tensor:
    """Every row as one float32 tensor on the rows' device: only for the full-batch algorithms,
    which read every row at every step anyway (their models and datasets are small)."""
    if isinstance(rows, TensorRows):
        return rows.tensor
    out = torch.empty((rows.n_rows, *rows.row_shape), dtype=torch.float32, device=rows.device)
    for index in iter_row_chunks(rows, chunk_rows=chunk_rows):
        out[index] = rows.take(index)
    return out
