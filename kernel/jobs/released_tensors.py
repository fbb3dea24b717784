"""A released model file's tensors, read and rewritten without torch.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and byte
range in the data, and the metadata), then the data. The downloads in the ecosystem's formats
(``hf_release``, ``peft_release``) write a chosen part of the released file under other names:
the header is rebuilt with contiguous byte ranges, and each tensor's bytes are copied as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from kernel.base_models.safetensors_header import HEADER_BOUNDS, MAX_HEADER_BYTES
from kernel.bounded_json import loads_bounded
from privtrain_common.model_format import CONFIG_KEY

__all__ = ["read_header", "released_config", "write_renamed"]

_COPY_CHUNK = 1 << 20


def read_header(handle: IO[bytes]) -> tuple[dict[str, Any], int]:
    """The file's header (tensor table and metadata) and its length in bytes; ``handle`` is left
    at the start of the data."""
    length = int.from_bytes(handle.read(8), "little")
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"the model file's header is over {MAX_HEADER_BYTES} bytes")
    header = loads_bounded(handle.read(length).decode("utf-8"), bounds=HEADER_BOUNDS)
    if not isinstance(header, dict):
        raise ValueError("the model file's header is not a JSON object")
    return header, length


def released_config(model_path: Path) -> dict[str, Any]:
    """The architecture config a released model file carries in its metadata."""
    with model_path.open("rb") as handle:
        header, _ = read_header(handle)
    config = json.loads(header["__metadata__"][CONFIG_KEY])
    if not isinstance(config, dict):
        raise ValueError("the model file's config is not a JSON object")
    return config


def _encoded(table: Mapping[str, Any]) -> bytes:
    """The header as safetensors writes it: compact JSON padded with spaces to 8 bytes."""
    encoded = json.dumps(table, separators=(",", ":")).encode("utf-8")
    return encoded + b" " * (-len(encoded) % 8)


def write_renamed(
    model_path: Path, target: IO[bytes], *, rename: Callable[[str], str | None], metadata: Mapping[str, str]
) -> int:
    """Write the tensors of ``model_path`` that ``rename`` gives a name (None: left out) to ``target``
    as a safetensors file with ``metadata``, in the order of their bytes; returns how many."""
    with model_path.open("rb") as source:
        header, length = read_header(source)
        data_start = 8 + length
        chosen = sorted(
            (
                (renamed, entry)
                for name, entry in header.items()
                if name != "__metadata__" and (renamed := rename(name))
            ),
            key=lambda item: int(item[1]["data_offsets"][0]),
        )
        table: dict[str, Any] = {"__metadata__": dict(metadata)}
        offset = 0
        for renamed, entry in chosen:
            begin, end = (int(value) for value in entry["data_offsets"])
            table[renamed] = {
                "dtype": entry["dtype"],
                "shape": entry["shape"],
                "data_offsets": [offset, offset + end - begin],
            }
            offset += end - begin
        encoded = _encoded(table)
        target.write(len(encoded).to_bytes(8, "little"))
        target.write(encoded)
        for _, entry in chosen:
            begin, end = (int(value) for value in entry["data_offsets"])
            source.seek(data_start + begin)
            left = end - begin
            while left:
                chunk = source.read(min(left, _COPY_CHUNK))
                if not chunk:
                    raise ValueError("the model file ends before its tensors do")
                target.write(chunk)
                left -= len(chunk)
    return len(chosen)
