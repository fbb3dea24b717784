"""A text dataset's token ids, read batch by batch as int64 on the training device.

The API stores each text dataset once as an (n, max_length) ``.npy`` of token ids (uint16 when
the vocabulary allows, else int32), right-padded with the tokenizer's pad id (kernel/ingest/text.py).
:class:`TokenRows` opens it with ``np.load(..., mmap_mode="r")`` (never unpickling anything) and
either copies it to the GPU once, when it fits in ``max_device_fraction`` of the device's memory
(kept there as int32: half of int64, and indexable on every device), or leaves it memory-mapped,
reading only the rows a batch touches. Either way ``take`` returns int64 ids, what embedding
layers take; the models find padding as ``tokens == pad_id``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dp.losses import IGNORED_TARGET

__all__ = ["IGNORED_TARGET", "TokenRows", "language_model_targets", "open_token_array"]

COPY_CHUNK_ROWS = 4096
"""Rows copied to the device at a time when the array is placed there (bounds the host copy)."""


def open_token_array(path: Path, *, max_length: int | None = None) -> np.ndarray:
    """The stored ids, memory-mapped; checks they are an integer (n, max_length) array."""
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    if not isinstance(array, np.ndarray) or array.dtype not in (np.uint16, np.int32) or array.ndim != 2:
        raise ValueError(f"{path.name} is not a uint16 or int32 (n, max_length) token array")
    if max_length is not None and array.shape[1] != max_length:
        raise ValueError(f"{path.name} holds rows of {array.shape[1]} tokens, not the dataset's {max_length}")
    return array


class TokenRows:
    """Token-id rows by index (dp/data/rows.py ``Rows``): ``take`` gives int64 (b, max_length)."""

    def __init__(self, tokens: np.ndarray, *, device: torch.device | str = "cpu", resident: bool = False) -> None:
        """``tokens``: the (n, max_length) ids (memory-mapped or in memory); ``resident``: copy
        them to ``device`` once, so each batch is gathered there."""
        if tokens.ndim != 2 or tokens.dtype not in (np.uint16, np.int32):
            raise ValueError("TokenRows holds a uint16 or int32 (n, max_length) array")
        self._tokens = tokens
        self._device = torch.device(device)
        self._resident = _copy_to(tokens, self._device) if resident else None

    @classmethod
    def placed(cls, path: Path, *, max_length: int, device: torch.device, max_device_fraction: float) -> TokenRows:
        """On a GPU, the whole array on the device when its int32 copy takes at most
        ``max_device_fraction`` of the device's memory; otherwise, and on the CPU, memory-mapped."""
        tokens = open_token_array(path, max_length=max_length)
        resident = False
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            resident = tokens.shape[0] * tokens.shape[1] * 4 <= max_device_fraction * total
        return cls(tokens, device=device, resident=resident)

    @property
    def n_rows(self) -> int:
        return int(self._tokens.shape[0])

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def row_shape(self) -> tuple[int, ...]:
        return (int(self._tokens.shape[1]),)

    @property
    def resident(self) -> bool:
        """True when the ids are held on the device (copied once), False when memory-mapped."""
        return self._resident is not None

    def take(self, index: torch.Tensor) -> torch.Tensor:
        if self._resident is not None:
            return self._resident[index.to(self._device)].to(torch.int64)
        positions = index.to("cpu", torch.int64).numpy()
        batch = torch.from_numpy(np.array(self._tokens[positions], dtype=np.int64))
        if self._device.type == "cuda":
            return batch.pin_memory().to(self._device, non_blocking=True)
        return batch.to(self._device)

    def raw(self, index: np.ndarray | slice) -> np.ndarray:
        """The stored ids at ``index`` as int64, on the host (a copy of just those rows)."""
        return np.array(self._tokens[index], dtype=np.int64)


def _copy_to(tokens: np.ndarray, device: torch.device) -> torch.Tensor:
    """Chunk by chunk, so the host never holds a second whole copy."""
    out = torch.empty(tuple(int(d) for d in tokens.shape), dtype=torch.int32, device=device)
    for start in range(0, tokens.shape[0], COPY_CHUNK_ROWS):
        chunk = torch.from_numpy(np.array(tokens[start : start + COPY_CHUNK_ROWS], dtype=np.int32))
        out[start : start + chunk.shape[0]].copy_(chunk)
    return out


def language_model_targets(rows: TokenRows, *, pad_id: int) -> torch.Tensor:
    """int64 (n, max_length) targets: the ids, with every pad position ``IGNORED_TARGET``
    (built chunk by chunk from the stored array, on the host)."""
    targets = torch.empty((rows.n_rows, *rows.row_shape), dtype=torch.int64)
    for start in range(0, rows.n_rows, COPY_CHUNK_ROWS):
        chunk = rows.raw(slice(start, start + COPY_CHUNK_ROWS))
        chunk[chunk == pad_id] = IGNORED_TARGET
        targets[start : start + chunk.shape[0]] = torch.from_numpy(chunk)
    return targets
