"""Read a safetensors file's tensor table without torch (and without ever unpickling anything).

The format: an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets": [begin, end]}, optional "__metadata__": {str: str}}), then the raw tensor bytes.
Everything is checked here: the header's size, that it is a JSON object, each entry's fields, and
that the data offsets tile the byte buffer exactly (no gap, no overlap, nothing after the end).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from app.errors import InvalidInput

MAX_HEADER_BYTES = 16 * 1024 * 1024
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]


class InvalidSafetensors(InvalidInput):
    """The body is not a well-formed safetensors file."""

    def __init__(self, detail: str) -> None:
        super().__init__(slug="invalid-safetensors", detail=f"not a valid safetensors file: {detail}")


def _entry(name: str, raw: object) -> tuple[TensorEntry, tuple[int, int]]:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise InvalidSafetensors(f"tensor {name!r} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise InvalidSafetensors(f"tensor {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise InvalidSafetensors(f"tensor {name!r} has an invalid shape")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise InvalidSafetensors(f"tensor {name!r} has invalid data_offsets")
    begin, end = offsets
    if not 0 <= begin <= end or end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise InvalidSafetensors(f"tensor {name!r}: its data_offsets do not match its dtype and shape")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape)), (begin, end)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The file's tensors by name; raises :class:`InvalidSafetensors` for anything malformed."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise InvalidSafetensors("shorter than the 8-byte header length")
        header_length = int.from_bytes(prefix, "little")
        if header_length > MAX_HEADER_BYTES or 8 + header_length > size:
            raise InvalidSafetensors(f"header length {header_length} exceeds the file or {MAX_HEADER_BYTES} bytes")
        raw = handle.read(header_length)
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidSafetensors("the header is not JSON") from None
    if not isinstance(table, dict):
        raise InvalidSafetensors("the header is not a JSON object")
    metadata = table.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidSafetensors("__metadata__ must map strings to strings")
    entries: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int]] = []
    for name, value in table.items():
        entry, span = _entry(name, value)
        entries[name] = entry
        spans.append(span)
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise InvalidSafetensors("the tensors' data_offsets leave a gap or overlap")
        position = end
    if 8 + header_length + position != size:
        raise InvalidSafetensors("the data does not end where the last tensor ends")
    return entries
