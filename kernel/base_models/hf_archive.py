"""A zipped Transformers ``save_pretrained`` folder, read without torch and without unpickling.

``POST /v1/base-models?format=hf`` takes such a ZIP: ``config.json`` and the weights as
``model.safetensors`` or as shards listed by ``model.safetensors.index.json``, optionally the
tokenizer's and generation settings' files. Pickled weights (``pytorch_model.bin``, ``.pt``…) are
refused with the way out (convert to safetensors): loading them would run code from the upload.
Every member is bounded before it is read (count, sizes, the total as unpacked: a ZIP bomb is
refused from its directory), names are plain relative paths, and the archive may hold the folder
itself (``my-model/config.json``) or its contents.
"""

from __future__ import annotations

import posixpath
import shutil
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from kernel.base_models.safetensors_header import LocatedTensor, read_table
from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded
from kernel.errors import InvalidInput

CONFIG = "config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
OPTIONAL_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        "vocab.txt",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
        "README.md",
        ".gitattributes",
    }
)
"""Files a ``save_pretrained`` folder may also hold, accepted and not used for the weights."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".h5", ".msgpack", ".ot")
MAX_MEMBERS = 256
MAX_JSON_BYTES = 1024 * 1024
"""config.json (with its label maps) and the shard index are far smaller."""
JSON_BOUNDS = JsonBounds(max_chars=MAX_JSON_BYTES, max_depth=16)
_COPY_CHUNK = 1 << 20


class ArchiveRefused(InvalidInput):
    """The upload is not a ZIP of a ``save_pretrained`` folder this service reads (422)."""

    def __init__(self, detail: str, *, reason: str) -> None:
        super().__init__(slug="invalid-hf-archive", detail=detail, extra={"reason": reason})


class PickledWeightsRefused(InvalidInput):
    def __init__(self, names: list[str]) -> None:
        super().__init__(
            slug="pickled-weights-refused",
            detail=f"the archive holds pickled weights ({', '.join(names[:5])}); loading a pickle runs code, so "
            "only safetensors are read. Convert them: model.save_pretrained(folder, safe_serialization=True), "
            "then zip the folder",
            extra={"files": names[:20]},
        )


class Writable(Protocol):
    def write(self, data: bytes, /) -> object: ...


@dataclass(frozen=True)
class ArchiveTensor:
    """A checkpoint tensor: the member that holds it and where in that member."""

    member: str
    located: LocatedTensor


@dataclass(frozen=True)
class HFArchive:
    path: Path
    config: dict[str, Any]
    tensors: dict[str, ArchiveTensor]
    """Every tensor of the checkpoint by its Transformers name."""
    files: tuple[str, ...]
    """The folder's files, as named inside it."""
    members: Mapping[str, str]
    """A file's name in the folder → its name in the ZIP."""


def _folder_names(infos: list[zipfile.ZipInfo]) -> dict[str, zipfile.ZipInfo]:
    """Each file by its name inside the folder (one shared top directory stripped)."""
    files = [info for info in infos if not info.is_dir()]
    for info in files:
        name = info.filename
        normal = posixpath.normpath(name)
        if name.startswith(("/", "\\")) or "\\" in name or normal.startswith("..") or normal != name.rstrip("/"):
            raise ArchiveRefused(f"member {name[:200]!r} is not a plain relative path", reason="member-path")
    tops = {info.filename.split("/", 1)[0] for info in files}
    strip = len(tops) == 1 and all("/" in info.filename for info in files)
    named = {(info.filename.split("/", 1)[1] if strip else info.filename): info for info in files}
    nested = sorted(name for name in named if "/" in name)
    if nested:
        raise ArchiveRefused(
            f"the archive nests folders ({', '.join(nested[:5])}); zip one save_pretrained folder", reason="nested"
        )
    return named


def _check_files(named: Mapping[str, zipfile.ZipInfo], *, max_bytes: int) -> None:
    pickles = sorted(name for name in named if name.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise PickledWeightsRefused(pickles)
    if len(named) > MAX_MEMBERS:
        raise ArchiveRefused(f"the archive holds more than {MAX_MEMBERS} files", reason="too-many-members")
    unpacked = sum(info.file_size for info in named.values())
    if unpacked > max_bytes:
        raise ArchiveRefused(
            f"the archive unpacks to {unpacked} bytes, more than the {max_bytes} bytes accepted", reason="too-large"
        )
    if CONFIG not in named:
        raise ArchiveRefused(
            "the archive has no config.json (zip the folder save_pretrained wrote)", reason="no-config"
        )


def _read_json(archive: zipfile.ZipFile, info: zipfile.ZipInfo, *, what: str) -> dict[str, Any]:
    if info.file_size > MAX_JSON_BYTES:
        raise ArchiveRefused(f"{what} is larger than {MAX_JSON_BYTES} bytes", reason="json-too-large")
    with archive.open(info) as handle:
        raw = handle.read(MAX_JSON_BYTES + 1)
    try:
        parsed = loads_bounded(raw.decode("utf-8"), bounds=JSON_BOUNDS)
    except UnicodeDecodeError:
        raise ArchiveRefused(f"{what} is not UTF-8 text", reason="json-invalid") from None
    except JsonRefused as exc:
        raise ArchiveRefused(f"{what}: {exc.detail}", reason="json-invalid") from None
    if not isinstance(parsed, dict):
        raise ArchiveRefused(f"{what} is not a JSON object", reason="json-invalid")
    return parsed


def _weight_files(archive: zipfile.ZipFile, named: Mapping[str, zipfile.ZipInfo]) -> list[str]:
    """The safetensors members that hold the weights: the single file or the index's shards."""
    if SINGLE_WEIGHTS in named:
        return [SINGLE_WEIGHTS]
    if WEIGHTS_INDEX not in named:
        raise ArchiveRefused(
            "the archive has neither model.safetensors nor model.safetensors.index.json with its shards",
            reason="no-weights",
        )
    index = _read_json(archive, named[WEIGHTS_INDEX], what=WEIGHTS_INDEX)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ArchiveRefused(f"{WEIGHTS_INDEX} has no weight_map of tensor → file", reason="index-invalid")
    shards = sorted(set(weight_map.values()))
    missing = [shard for shard in shards if shard not in named]
    if missing or not all(shard.endswith(".safetensors") for shard in shards):
        raise ArchiveRefused(
            f"{WEIGHTS_INDEX} names shards the archive lacks or that are not safetensors: {(missing or shards)[:5]}",
            reason="index-invalid",
        )
    return shards


def open_archive(path: Path, *, max_bytes: int) -> HFArchive:
    """The archive's config and tensor table; :class:`ArchiveRefused` (or a more specific 422) for
    anything else. Nothing is unpacked: the tensors are located inside their members."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError):
        raise ArchiveRefused("the body is not a ZIP archive", reason="not-a-zip") from None
    with archive:
        named = _folder_names(archive.infolist())
        _check_files(named, max_bytes=max_bytes)
        config = _read_json(archive, named[CONFIG], what=CONFIG)
        tensors: dict[str, ArchiveTensor] = {}
        for shard in _weight_files(archive, named):
            info = named[shard]
            with archive.open(info) as handle:
                table = read_table(handle, size=info.file_size)
            for name, located in table.items():
                if name in tensors:
                    raise ArchiveRefused(f"tensor {name[:200]!r} is in two shards", reason="duplicate-tensor")
                tensors[name] = ArchiveTensor(member=info.filename, located=located)
    return HFArchive(
        path=path,
        config=config,
        tensors=tensors,
        files=tuple(sorted(named)),
        members={name: info.filename for name, info in named.items()},
    )


def read_member(archive: HFArchive, name: str, *, max_bytes: int) -> bytes:
    """A small file of the folder (a tokenizer's), refused when larger than ``max_bytes``."""
    with zipfile.ZipFile(archive.path) as zipped:
        info = zipped.getinfo(archive.members[name])
        if info.file_size > max_bytes:
            raise ArchiveRefused(f"{name} is larger than {max_bytes} bytes", reason="member-too-large")
        with zipped.open(info) as handle:
            return handle.read(max_bytes + 1)[:max_bytes]


def read_json_member(archive: HFArchive, name: str) -> dict[str, Any] | None:
    """A JSON file of the folder as an object, or None when the folder has no such file."""
    if name not in archive.members:
        return None
    with zipfile.ZipFile(archive.path) as zipped:
        return _read_json(zipped, zipped.getinfo(archive.members[name]), what=name)


def write_safetensors(archive: HFArchive, *, sources: Mapping[str, str], out: Writable) -> None:
    """One safetensors file of ``sources`` (name in the file → checkpoint tensor), the bytes copied
    as they are (no dtype changes). A checkpoint tensor may be written under several names (a
    tied LM head and its embedding). The data is written in the members' own order, so each
    member is read once from start to end (a deflated member cannot be read out of order)."""
    import json

    def where(item: tuple[str, str]) -> tuple[str, int]:
        tensor = archive.tensors[item[1]]
        return tensor.member, tensor.located.begin

    ordered = sorted(sources.items(), key=where)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, source in ordered:
        located = archive.tensors[source].located
        size = located.end - located.begin
        header[name] = {
            "dtype": located.entry.dtype,
            "shape": list(located.entry.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    out.write(len(encoded).to_bytes(8, "little"))
    out.write(encoded)
    with zipfile.ZipFile(archive.path) as zipped:
        handle: IO[bytes] | None = None
        member, position = "", 0
        try:
            for _name, source in ordered:
                tensor = archive.tensors[source]
                if handle is None or tensor.member != member or tensor.located.begin < position:
                    if handle is not None:
                        handle.close()
                    handle, member, position = zipped.open(tensor.member), tensor.member, 0
                _skip(handle, tensor.located.begin - position)
                _copy(handle, out, tensor.located.end - tensor.located.begin)
                position = tensor.located.end
        finally:
            if handle is not None:
                handle.close()


def _skip(handle: IO[bytes], count: int) -> None:
    while count > 0:
        got = handle.read(min(count, _COPY_CHUNK))
        if not got:
            raise ArchiveRefused("a weights member ended early", reason="truncated")
        count -= len(got)


def _copy(handle: IO[bytes], out: Writable, count: int) -> None:
    shutil.copyfileobj(_Limited(handle, count), out, _COPY_CHUNK)


class _Limited:
    """The next ``count`` bytes of a stream, for copyfileobj."""

    def __init__(self, handle: IO[bytes], count: int) -> None:
        self.handle, self.left = handle, count

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if size < 0 else min(size, self.left)
        got = self.handle.read(want)
        if len(got) < want:
            raise ArchiveRefused("a weights member ended early", reason="truncated")
        self.left -= len(got)
        return got
