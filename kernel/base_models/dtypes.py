"""Which stored dtypes a base model's tensors may have, and which ones an upload used.

Public checkpoints usually ship in half precision (F16 or BF16) although every zoo parameter is
F32. Any floating dtype is accepted for a floating parameter: the worker casts each tensor to the
parameter's dtype when it loads the file, so F16/BF16 values arrive exactly and F64 ones are
rounded once. An integer or bool tensor never fits a floating parameter (it is not a weight), and
a non-floating entry must match exactly.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kernel.base_models.safetensors_header import TensorEntry, read_header
from kernel.db.orm import BaseModelRecord
from kernel.storage.blobs import BlobStore

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
"""The safetensors dtypes that hold floating-point values."""


def dtype_fits(found: str, *, expected: str) -> bool:
    """Whether a tensor stored as ``found`` can be loaded into a parameter of dtype ``expected``."""
    if expected in FLOAT_DTYPES:
        return found in FLOAT_DTYPES
    return found == expected


def distinct_dtypes(entries: dict[str, TensorEntry]) -> list[str]:
    """The dtypes a file's tensors use, each once, sorted (e.g. ``["BF16"]``, or two for a mixed file)."""
    return sorted({entry.dtype for entry in entries.values()})


@lru_cache(maxsize=1024)
def _dtypes_of_blob(sha256: str, path: str) -> tuple[str, ...]:
    """Keyed by content hash: a stored blob never changes, so its header is read once per process."""
    return tuple(distinct_dtypes(read_header(Path(path))))


def stored_dtypes(blobs: BlobStore, record: BaseModelRecord) -> list[str]:
    """The dtypes the base model was uploaded in, read from its stored file's header (no tensor data);
    empty if the file is gone (it outlives its row, never the reverse)."""
    if not blobs.exists(record.blob_key):
        return []
    return list(_dtypes_of_blob(record.sha256, str(blobs.local_path(record.blob_key))))
