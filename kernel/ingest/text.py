"""Text datasets: the options of a JSON Lines upload, its task and labels, and its token-id array.

A text upload is read twice, streamed both times, so no second copy of a large corpus is held:
``scan_text`` validates every record and resolves the task and labels (and so learns n);
``write_token_rows`` then tokenises the texts in chunks, straight into the ``.npy`` file the
worker memory-maps: (n, max_length) token ids, truncated at ``max_length`` and right-padded with
the tokenizer's pad id, uint16 when every id fits, int32 otherwise.

How many rows were truncated is deliberately neither stored nor shown: it depends on the
lengths of the private texts, so it is not a public fact of the dataset.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, TypedDict, get_args

import numpy as np

from kernel.ingest.classes import task_for_class_list
from kernel.ingest.dataset import ClassList
from kernel.ingest.jsonl import JsonlFields, JsonlRecord, read_records
from kernel.ingest.labels import resolve_labels
from kernel.ingest.limits import IngestLimits
from kernel.ingest.registry import RawLabels, RowPositions, TextLabels
from kernel.ingest.text_errors import TextValidationError
from kernel.tokenizers.base import BYTE_TOKENIZER_ID, TextTokenizer

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "TEXT_FORMATS",
    "TEXT_TASKS",
    "ScannedText",
    "TextFacts",
    "TextOptions",
    "TextTask",
    "check_text_options",
    "rescan_text",
    "scan_text",
    "token_dtype",
    "write_token_rows",
]

TextTask = Literal["classification", "language-model"]
TEXT_TASKS: tuple[TextTask, ...] = get_args(TextTask)
TEXT_FORMATS = ("jsonl",)
DEFAULT_MAX_LENGTH = 128
"""Tokens a row keeps when the upload names no ``max_length``."""
ENCODE_CHUNK_ROWS = 1024
"""Texts tokenised at a time: bounds the memory of the second pass whatever n is."""
UINT16_IDS = 65_536


class TextFacts(TypedDict):
    """The public facts of a text dataset (as IngestFacts, with the text tasks): n, and the shape
    (max_length,) the owner declared."""

    n_rows: int
    feature_shape: tuple[int, ...]
    n_features: int
    task: TextTask
    n_classes: int | None
    n_units: int | None


@dataclass(frozen=True)
class TextOptions:
    """The owner's declarations for a text upload: all public, none depends on the texts."""

    tokenizer: str = BYTE_TOKENIZER_ID
    max_length: int = DEFAULT_MAX_LENGTH
    fields: JsonlFields = field(default_factory=JsonlFields)

    def to_json(self) -> dict[str, object]:
        """For the upload's request digest (idempotency)."""
        declared: dict[str, object] = {
            "tokenizer": self.tokenizer,
            "max_length": self.max_length,
            "text_field": self.fields.text,
            "label_field": self.fields.label,
        }
        if self.fields.unit is not None:  # absent from digests made before privacy units existed
            declared["unit_field"] = self.fields.unit
        return declared


def check_text_options(options: TextOptions, *, limits: IngestLimits) -> TextOptions:
    """Refuse declarations that are wrong whatever the file holds, before it is read."""
    if not 1 <= options.max_length <= limits.max_text_length:
        raise TextValidationError(
            "bad-text-options", f"max_length must be between 1 and {limits.max_text_length} tokens"
        )
    if not options.fields.text or not options.fields.label or options.fields.text == options.fields.label:
        raise TextValidationError(
            "bad-text-options", "text_field and label_field must be non-empty and different member names"
        )
    if options.fields.unit in (options.fields.text, options.fields.label):
        raise TextValidationError(
            "bad-text-options", "privacy_unit_column must name a member other than the text and the label"
        )
    return options


@dataclass(frozen=True, eq=False)
class ScannedText:
    """What the first pass learned: n, the task, and for classification the labels."""

    n_rows: int
    task: TextTask
    y: np.ndarray | None = field(repr=False)
    """int64 (n,) class indices for classification; None for language modelling."""
    classes: ClassList | None
    units: np.ndarray | None = field(default=None, repr=False)
    """int64 (n,) each record's privacy unit, 0 .. n_units - 1; None without a unit member."""

    @property
    def n_units(self) -> int | None:
        return None if self.units is None else int(self.units.max()) + 1

    def facts(self, *, max_length: int) -> TextFacts:
        return TextFacts(
            n_rows=self.n_rows,
            feature_shape=(max_length,),
            n_features=max_length,
            task=self.task,
            n_classes=len(self.classes.names) if self.classes is not None else None,
            n_units=self.n_units,
        )


def _check_task(task: str | None, classes: tuple[str, ...] | None) -> TextTask | None:
    requested = task_for_class_list(task, classes)
    if requested is None:
        return None
    for known in TEXT_TASKS:  # a loop rather than `in`, so that the result is typed as a TextTask
        if requested == known:
            return known
    raise TextValidationError(
        "unknown-text-task",
        f"a text dataset's task is one of {', '.join(TEXT_TASKS)}, or omitted to follow from the records",
    )


class _LabelCollector:
    """Labels in flat buffers (8 bytes a row), with the distinct texts while a class list could hold them."""

    def __init__(self, *, max_classes: int) -> None:
        self.numbers: array[float] = array("d")
        self.codes: array[int] | None = array("q")
        self.texts: dict[str, int] = {}
        self.lines: array[int] = array("q")
        self._max_classes = max_classes

    def add(self, record: JsonlRecord) -> None:
        self.lines.append(record.line)
        label = record.label
        if isinstance(label, int):
            self.numbers.append(float(label))
            text = str(label)
        else:
            assert label is not None
            self.numbers.append(float("nan"))
            text = label.strip()
        if self.codes is None:
            return
        code = self.texts.get(text)
        if code is None:
            if len(self.texts) > self._max_classes:  # more than any class list: numbers only
                self.codes, self.texts = None, {}
                return
            code = self.texts[text] = len(self.texts)
        self.codes.append(code)

    def raw(self) -> tuple[RawLabels, RowPositions]:
        codes = self.codes
        labels = RawLabels(
            numbers=np.frombuffer(self.numbers, dtype=np.float64).copy(),
            texts=TextLabels(
                codes=np.frombuffer(codes, dtype=np.int64).copy() if codes is not None else None,
                distinct=tuple(self.texts),
            ),
        )
        return labels, RowPositions(line_numbers=np.frombuffer(self.lines, dtype=np.int64).copy())


def scan_text(
    path: Path,
    *,
    task: str | None,
    classes: tuple[str, ...] | None,
    options: TextOptions,
    limits: IngestLimits,
) -> ScannedText:
    """Validate every record and resolve the task: classification when the records carry the
    label member (labels mapped to ``classes`` when declared, as for other formats), language
    modelling when they do not. A requested ``task`` must agree with the records."""
    requested = _check_task(task, classes)
    collector = _LabelCollector(max_classes=limits.max_classes)
    unit_ids: dict[str, int] = {}
    unit_codes = array("q")
    n_rows = 0
    labelled = False
    for record in read_records(path, fields=options.fields, limits=limits):
        n_rows += 1
        if record.unit is not None:
            unit_codes.append(unit_ids.setdefault(record.unit, len(unit_ids)))
        if record.label is not None:
            labelled = True
            collector.add(record)
    units = np.frombuffer(unit_codes, dtype=np.int64).copy() if options.fields.unit is not None else None
    found: TextTask = "classification" if labelled else "language-model"
    if requested is not None and requested != found:
        has = "carry" if labelled else "have no"
        raise TextValidationError(
            "jsonl-missing-field",
            f"task={requested} was requested but the records {has} a {options.fields.label!r} member, "
            f"which makes the dataset {found}",
        )
    if not labelled:
        return ScannedText(n_rows=n_rows, task="language-model", y=None, classes=None, units=units)
    raw, rows = collector.raw()
    labels = resolve_labels(raw, task="classification", classes=classes, max_classes=limits.max_classes, rows=rows)
    return ScannedText(n_rows=n_rows, task="classification", y=labels.y, classes=labels.classes, units=units)


def rescan_text(
    path: Path, *, task: str, classes: tuple[str, ...] | None, fields: JsonlFields, limits: IngestLimits
) -> ScannedText:
    """A registered text dataset's labels (mapped to its public class list) and privacy units
    (with ``fields.unit``), read again from its upload exactly as at registration: one pass for
    the worker."""
    return scan_text(path, task=task, classes=classes, options=TextOptions(fields=fields, max_length=1), limits=limits)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id (below ``vocab_size``) fits in it, else int32; little-endian either way."""
    return np.dtype("<u2") if vocab_size <= UINT16_IDS else np.dtype("<i4")


class _Sink(Protocol):
    def write(self, chunk: bytes, /) -> object: ...


def write_token_rows(
    path: Path,
    *,
    options: TextOptions,
    tokenizer: TextTokenizer,
    n_rows: int,
    limits: IngestLimits,
    out: _Sink,
) -> np.dtype:
    """Write the (n, max_length) token ids of the upload's texts to ``out`` as a ``.npy`` file,
    chunk by chunk; returns their dtype. The texts were validated by :func:`scan_text`."""
    dtype = token_dtype(tokenizer.vocab_size)
    width = options.max_length
    if n_rows * width * dtype.itemsize > limits.max_decompressed_bytes:
        raise TextValidationError(
            "token-array-too-large",
            f"{n_rows} rows of {width} tokens take more than {limits.max_decompressed_bytes} bytes; "
            "lower max_length or split the upload",
        )
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n_rows, width)}
    np.lib.format.write_array_header_1_0(out, header)
    written = 0
    for texts in _chunks(read_records(path, fields=options.fields, limits=limits)):
        block = np.full((len(texts), width), tokenizer.pad_id, dtype=dtype)
        for row, ids in enumerate(tokenizer.encode_batch(texts)):
            kept = ids[:width]  # truncated rows are not counted: that count is a fact of the private texts
            if kept and (min(kept) < 0 or max(kept) >= tokenizer.vocab_size):
                raise ValueError("the tokenizer produced an id outside its vocabulary")
            block[row, : len(kept)] = kept
        out.write(block.tobytes())
        written += len(texts)
    if written != n_rows:
        raise ValueError(f"the upload changed between its two readings ({n_rows} then {written} records)")
    return dtype


def _chunks(records: Iterator[JsonlRecord]) -> Iterator[list[str]]:
    texts: list[str] = []
    for record in records:
        texts.append(record.text)
        if len(texts) == ENCODE_CHUNK_ROWS:
            yield texts
            texts = []
    if texts:
        yield texts
