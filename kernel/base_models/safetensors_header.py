"""Read a safetensors file's tensor table without torch (and without ever unpickling anything).

The format: an 8-byte little-endian header length N, N bytes of JSON ({name: {"dtype", "shape",
"data_offsets": [begin, end]}, optional "__metadata__": {str: str}}), then the raw tensor bytes.
Everything is checked here: the header's size, that it is JSON within bounds (nesting, number
length: kernel/bounded_json.py) and an object, each entry's fields and their types, and that the data
offsets lie inside the file and tile the byte buffer exactly (no gap, no overlap, nothing after
the end). Anything else is an :class:`InvalidSafetensors` (422), never an unexpected exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded
from kernel.errors import InvalidInput

MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_DIMS = 32
"""Dimensions a tensor may have (the architectures here use at most 4)."""
MAX_NAME_IN_MESSAGE = 200
HEADER_BOUNDS = JsonBounds(max_chars=MAX_HEADER_BYTES, max_depth=8, max_number_chars=20)
"""A valid header nests 3 levels ({name: {"shape": [...]}}); offsets and dimensions are unsigned
64-bit (at most 20 digits)."""
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]


class InvalidSafetensors(InvalidInput):
    """The body is not a well-formed safetensors file."""

    def __init__(self, detail: str, *, reason: str = "malformed") -> None:
        super().__init__(
            slug="invalid-safetensors", detail=f"not a valid safetensors file: {detail}", extra={"reason": reason}
        )


def _named(name: str) -> str:
    """A tensor name for a message: quoted, and cut short (a name may be megabytes long)."""
    return repr(name) if len(name) <= MAX_NAME_IN_MESSAGE else repr(name[:MAX_NAME_IN_MESSAGE]) + "…"


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, raw: object, *, data_bytes: int) -> tuple[TensorEntry, tuple[int, int]]:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "data_offsets"}:
        raise InvalidSafetensors(f"tensor {_named(name)} must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = raw["dtype"], raw["shape"], raw["data_offsets"]
    if not isinstance(dtype, str):
        raise InvalidSafetensors(f"tensor {_named(name)} has a dtype that is not a string")
    if dtype not in DTYPE_BYTES:
        shown = repr(dtype) if len(dtype) <= MAX_NAME_IN_MESSAGE else "of that name"
        raise InvalidSafetensors(f"tensor {_named(name)} has unsupported dtype {shown}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_is_count(d) for d in shape):
        raise InvalidSafetensors(
            f"tensor {_named(name)} has an invalid shape: at most {MAX_DIMS} whole numbers, none negative"
        )
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise InvalidSafetensors(f"tensor {_named(name)} has invalid data_offsets: two whole numbers, none negative")
    begin, end = offsets
    if not begin <= end <= data_bytes:
        raise InvalidSafetensors(
            f"tensor {_named(name)}: its data_offsets lie outside the file's {data_bytes} data bytes"
        )
    # At most MAX_DIMS numbers of at most 20 digits each: the product is a small integer to build.
    if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
        raise InvalidSafetensors(f"tensor {_named(name)}: its data_offsets do not match its dtype and shape")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape)), (begin, end)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The file's tensors by name; raises :class:`InvalidSafetensors` for anything malformed."""
    with path.open("rb") as handle:
        return {name: located.entry for name, located in read_table(handle, size=path.stat().st_size).items()}


@dataclass(frozen=True)
class LocatedTensor:
    """A tensor's entry and where its bytes lie, counted from the start of the file."""

    entry: TensorEntry
    begin: int
    end: int


def read_table(handle: IO[bytes], *, size: int) -> dict[str, LocatedTensor]:
    """The tensor table of the safetensors file ``handle`` reads from its start (``size`` bytes in
    all), every entry and offset checked as :func:`read_header` checks them."""
    prefix = handle.read(8)
    if len(prefix) != 8:
        raise InvalidSafetensors("shorter than the 8-byte header length")
    header_length = int.from_bytes(prefix, "little")
    if header_length > MAX_HEADER_BYTES or 8 + header_length > size:
        raise InvalidSafetensors(f"header length {header_length} exceeds the file or {MAX_HEADER_BYTES} bytes")
    raw = handle.read(header_length)
    try:
        table = loads_bounded(raw.decode("utf-8"), bounds=HEADER_BOUNDS)
    except UnicodeDecodeError:
        raise InvalidSafetensors("the header is not UTF-8 text") from None
    except JsonRefused as exc:
        raise InvalidSafetensors(f"the header: {exc.detail}", reason=f"header-{exc.reason}") from None
    if not isinstance(table, dict):
        raise InvalidSafetensors("the header is not a JSON object")
    metadata = table.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise InvalidSafetensors("__metadata__ must map strings to strings")
    data_start = 8 + header_length
    data_bytes = size - data_start
    located: dict[str, LocatedTensor] = {}
    spans: list[tuple[int, int]] = []
    for name, value in table.items():
        entry, (begin, end) = _entry(name, value, data_bytes=data_bytes)
        located[name] = LocatedTensor(entry=entry, begin=data_start + begin, end=data_start + end)
        spans.append((begin, end))
    position = 0
    for begin, end in sorted(spans):
        if begin != position:
            raise InvalidSafetensors("the tensors' data_offsets leave a gap or overlap")
        position = end
    if data_start + position != size:
        raise InvalidSafetensors("the data does not end where the last tensor ends")
    return located
