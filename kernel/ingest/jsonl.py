"""Reading a JSON Lines text upload one record at a time, refusing what is malformed.

One JSON object per line, UTF-8 only. Blank lines are skipped (a trailing newline is common).
The file is streamed: a line is read with a byte cap before it is decoded, so no line and no
copy of the whole corpus is ever held; each is parsed within bounds on its nesting and its
numbers' length (kernel/bounded_json.py). Refusals name the line, never what it holds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded
from kernel.ingest.limits import IngestLimits
from kernel.ingest.parse_control import checkpoint
from kernel.ingest.text_errors import TextValidationError

__all__ = ["JsonlFields", "JsonlRecord", "read_records"]

_BOM = "\ufeff"
_RECORD_BOUNDS = JsonBounds(max_chars=sys.maxsize, max_depth=64, max_number_chars=100, allow_non_finite=True)
"""A record's bounds besides its line's byte limit (checked before it is decoded): nesting beyond
64 levels and number literals beyond 100 characters (Python refuses integers of 4,300 digits with
a bare ValueError) are refused, naming the line. NaN in a member the reader ignores is accepted,
as it always was; a label or unit must be a string or a whole number anyway."""


@dataclass(frozen=True)
class JsonlFields:
    """The names of the text and label members of each record (``text_field=``, ``label_field=``)."""

    text: str = "text"
    label: str = "label"
    unit: str | None = None
    """The member naming each record's privacy unit (``privacy_unit_column=``); None: a unit is a record."""


@dataclass(frozen=True)
class JsonlRecord:
    line: int
    """1-based line number in the upload."""
    text: str
    label: str | int | None
    """None when the record has no label member (a language-modelling dataset)."""
    unit: str | None = None
    """The record's privacy unit (the ``fields.unit`` member, as text); None without a unit member name."""


def read_records(path: Path, *, fields: JsonlFields, limits: IngestLimits) -> Iterator[JsonlRecord]:
    """Every record of the upload, in order; raises TextValidationError at the first bad line.

    Whether the records carry labels is decided by the first one: every later record must agree,
    so a dataset is wholly classification or wholly language modelling.
    """
    labelled: bool | None = None
    count = 0
    with path.open("rb") as stream:
        for line, raw in enumerate(_lines(stream, max_bytes=limits.max_text_line_bytes), start=1):
            text = _decode(raw, line=line)
            if line == 1 and text.startswith(_BOM):
                text = text[1:]
            if not text.strip():
                continue
            checkpoint()
            count += 1
            if count > limits.max_text_records:
                raise TextValidationError(
                    "jsonl-too-many-records",
                    f"line {line}: the upload has more than {limits.max_text_records} records",
                )
            record = _parse(text, line=line, fields=fields)
            if labelled is None:
                labelled = record.label is not None
            elif labelled != (record.label is not None):
                raise TextValidationError(
                    "jsonl-missing-field",
                    f"line {line}: "
                    + (f"has no {fields.label!r} member" if labelled else f"has a {fields.label!r} member")
                    + " unlike the first record; every record must have a label (classification) or none "
                    "(language modelling)",
                )
            yield record
    if count == 0:
        raise TextValidationError("jsonl-empty", "the upload holds no records (one JSON object per line)")


def _lines(stream: BinaryIO, *, max_bytes: int) -> Iterator[bytes]:
    """The lines without their line ending; a line longer than ``max_bytes`` is refused unread."""
    line = 0
    while True:
        raw: bytes = stream.readline(max_bytes + 2)  # room for the longest line plus "\r\n"
        if not raw:
            return
        line += 1
        content = raw.removesuffix(b"\n").removesuffix(b"\r")
        if len(content) > max_bytes:
            raise TextValidationError(
                "jsonl-line-too-long", f"line {line} is longer than {max_bytes} bytes (the line length limit)"
            )
        yield content


def _decode(raw: bytes, *, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextValidationError(
            "text-not-utf8", f"line {line}, byte {exc.start + 1}: the upload must be UTF-8 text"
        ) from None


def _parse(text: str, *, line: int, fields: JsonlFields) -> JsonlRecord:
    try:
        value = loads_bounded(text, bounds=_RECORD_BOUNDS)
    except JsonRefused as exc:
        raise TextValidationError("jsonl-invalid-line", f"line {line}: {exc.detail}") from None
    if not isinstance(value, dict):
        raise TextValidationError("jsonl-invalid-line", f"line {line} is a JSON {type(value).__name__}, not an object")
    if fields.text not in value:
        raise TextValidationError("jsonl-missing-field", f"line {line} has no {fields.text!r} member")
    body = value[fields.text]
    if not isinstance(body, str):
        raise TextValidationError("jsonl-bad-field", f"line {line}: the {fields.text!r} member must be a string")
    _check_encodable(body, line=line, member=fields.text)
    unit = _unit(value, line=line, member=fields.unit) if fields.unit is not None else None
    return JsonlRecord(line=line, text=body, label=_label(value, line=line, member=fields.label), unit=unit)


def _unit(value: dict[str, object], *, line: int, member: str) -> str:
    """A privacy unit: a non-empty string or a whole number (never quoted back: it identifies a person)."""
    if member not in value:
        raise TextValidationError(
            "jsonl-missing-field", f"line {line} has no {member!r} member (the privacy unit of every record)"
        )
    unit = value[member]
    if isinstance(unit, int) and not isinstance(unit, bool):
        return str(unit)
    if isinstance(unit, str) and unit.strip():
        _check_encodable(unit, line=line, member=member)
        return unit.strip()
    raise TextValidationError(
        "jsonl-bad-field",
        f"line {line}: the {member!r} member (the privacy unit) must be a non-empty string or a whole number",
    )


def _label(value: dict[str, object], *, line: int, member: str) -> str | int | None:
    if member not in value:
        return None
    label = value[member]
    if isinstance(label, str):
        _check_encodable(label, line=line, member=member)
        return label
    if isinstance(label, int) and not isinstance(label, bool):
        return label
    raise TextValidationError(
        "jsonl-bad-field", f"line {line}: the {member!r} member must be a string or a whole number"
    )


def _check_encodable(text: str, *, line: int, member: str) -> None:
    """JSON escapes can spell lone surrogates (``"\\ud800"``), which no UTF-8 text holds."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TextValidationError(
            "text-not-utf8", f"line {line}: the {member!r} member holds an unpaired surrogate escape"
        ) from None
