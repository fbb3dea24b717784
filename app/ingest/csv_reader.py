"""CSV reader: a UTF-8 file with a header row, streamed row by row into a float matrix."""

from __future__ import annotations

import codecs
import csv
import math
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from app.ingest.errors import DatasetValidationError
from app.ingest.limits import IngestLimits
from app.ingest.numeric import first_non_finite
from app.ingest.registry import RawDataset, RowPositions, register_reader

_BOM = codecs.BOM_UTF8
_FIELD_LIMIT_MESSAGE = "field larger than field limit"


class _Utf8Lines:
    """Physical lines of a binary stream, decoded one at a time.

    Decoding per line (rather than through a TextIOWrapper) lets a bad byte be reported at its
    own line, and reading with a byte budget keeps a file without newlines from being pulled
    into memory whole.
    """

    def __init__(self, stream: BinaryIO, *, max_line_bytes: int) -> None:
        self._stream = stream
        self.max_line_bytes = max_line_bytes
        # Lines handed out so far. The csv reader pulls a line only when the record it is
        # building needs one, so after each record this is the record's last line.
        self.line_number = 0

    def __iter__(self) -> Iterator[str]:
        while raw := self._stream.readline(self.max_line_bytes + 1):
            self.line_number += 1
            if self.line_number == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM) :]
            if len(raw) > self.max_line_bytes:
                raise DatasetValidationError(
                    "field-too-long",
                    f"line {self.line_number} is longer than {self.max_line_bytes} bytes, more "
                    "than a row of fields within the field length limit can take",
                )
            yield _decode(raw, line_number=self.line_number)


def _decode(raw: bytes, *, line_number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_byte = exc.start + 1
    # Raised outside the except block: the decode error holds the line's bytes, and chaining
    # it would carry private values into tracebacks.
    raise DatasetValidationError(
        "bad-encoding", f"line {line_number} is not valid UTF-8 (byte {bad_byte} of the line)"
    )


def _line_budget(n_fields: int, limits: IngestLimits) -> int:
    """Most bytes one physical line of a valid file can hold.

    Per field: up to 4 UTF-8 bytes per character, quotes doubled inside a quoted field (a quote
    is one byte, so 4 per character still covers it), two enclosing quotes and a comma; plus a
    CRLF and a possible BOM.
    """
    return n_fields * (4 * limits.max_field_chars + 3) + 2 + len(_BOM)


@register_reader("csv")
def read_csv(path: Path, *, label_column: str | None, limits: IngestLimits) -> RawDataset:
    """Parse a CSV upload; every field, the label included, must be a finite number."""
    if label_column is None:
        raise DatasetValidationError(
            "missing-label-column", "a CSV dataset needs label_column; none was given"
        )
    with open(path, "rb") as stream:
        lines = _Utf8Lines(stream, max_line_bytes=_line_budget(limits.max_features + 1, limits))
        reader = csv.reader(lines, strict=True)
        try:
            header = _read_header(reader, label_column=label_column, limits=limits)
            lines.max_line_bytes = _line_budget(len(header), limits)
            values, line_numbers = _read_body(reader, lines=lines, header=header, limits=limits)
        except csv.Error as exc:
            raise _structure_error(exc, line=lines.line_number) from None

    table = np.frombuffer(values, dtype=np.float64).reshape(len(line_numbers), len(header))
    label_index = header.index(label_column)
    feature_names = header[:label_index] + header[label_index + 1 :]
    rows = RowPositions(line_numbers=np.frombuffer(line_numbers, dtype=np.int64).copy())
    X = _features_float32(table, label_index=label_index)
    bad = first_non_finite(X)
    if bad is not None:
        row, column = bad
        raise DatasetValidationError(
            "non-finite",
            f"{rows.describe(row)}, column {feature_names[column]!r}: the number is too large "
            "for float32",
        )
    return RawDataset(
        X=X, labels=table[:, label_index].copy(), feature_names=feature_names, rows=rows
    )


def _read_header(
    reader: Iterator[list[str]], *, label_column: str, limits: IngestLimits
) -> tuple[str, ...]:
    header = next(reader, None)
    if header is None:
        raise DatasetValidationError("empty-dataset", "the file is empty; it needs a header row")
    if not header:
        raise DatasetValidationError("empty-dataset", "line 1, the header row, is empty")
    if len(header) > limits.max_features + 1:
        raise DatasetValidationError(
            "too-many-columns",
            f"the header has {len(header)} columns; at most {limits.max_features} feature "
            "columns plus the label column are allowed",
        )
    positions: dict[str, int] = {}
    for position, name in enumerate(header, start=1):
        if len(name) > limits.max_field_chars:
            raise DatasetValidationError(
                "field-too-long",
                f"header column {position} is longer than {limits.max_field_chars} characters",
            )
        if name in positions:
            raise DatasetValidationError(
                "duplicate-column",
                f"column name {name!r} appears twice in the header, at columns "
                f"{positions[name]} and {position}",
            )
        positions[name] = position
    if label_column not in positions:
        raise DatasetValidationError(
            "missing-label-column",
            f"label column {label_column!r} is not among the {len(header)} header columns",
        )
    if len(header) == 1:
        raise DatasetValidationError(
            "empty-dataset", "the header has no feature columns besides the label column"
        )
    return tuple(header)


def _read_body(
    reader: Iterator[list[str]],
    *,
    lines: _Utf8Lines,
    header: tuple[str, ...],
    limits: IngestLimits,
) -> tuple[array[float], array[int]]:
    """All data rows as one flat float64 buffer (8 bytes a value, not a Python float each)."""
    values: array[float] = array("d")
    line_numbers: array[int] = array("q")
    blank_line: int | None = None
    last_line = lines.line_number
    for row in reader:
        line, last_line = last_line + 1, lines.line_number
        if not row:
            # Blank lines only count once data follows them: trailing ones are ignored.
            if blank_line is None:
                blank_line = line
            continue
        if blank_line is not None:
            raise DatasetValidationError(
                "ragged-row",
                f"line {blank_line} is blank: 0 fields where the header has {len(header)}",
            )
        if len(line_numbers) == limits.max_rows:
            raise DatasetValidationError(
                "too-many-rows",
                f"line {line}: the file has more than {limits.max_rows} data rows",
            )
        values.extend(_parse_row(row, header=header, line=line, limits=limits))
        line_numbers.append(line)
    if not line_numbers:
        raise DatasetValidationError("empty-dataset", "the header is followed by no data rows")
    return values, line_numbers


def _parse_row(
    row: list[str], *, header: tuple[str, ...], line: int, limits: IngestLimits
) -> list[float]:
    if len(row) != len(header):
        raise DatasetValidationError(
            "ragged-row", f"line {line} has {len(row)} fields where the header has {len(header)}"
        )
    if max(map(len, row)) > limits.max_field_chars:
        column = next(i for i, field in enumerate(row) if len(field) > limits.max_field_chars)
        raise DatasetValidationError(
            "field-too-long",
            f"line {line}, column {header[column]!r}: the field is longer than "
            f"{limits.max_field_chars} characters",
        )
    try:
        parsed = list(map(float, row))
    except ValueError:
        parsed = None  # the error message quotes the field, so it must not become a cause
    if parsed is None:
        column = next(i for i, field in enumerate(row) if not _is_number(field))
        raise DatasetValidationError(
            "non-numeric", f"line {line}, column {header[column]!r}: the field is not a number"
        )
    if not all(map(math.isfinite, parsed)):
        column = next(i for i, value in enumerate(parsed) if not math.isfinite(value))
        raise DatasetValidationError(
            "non-finite",
            f"line {line}, column {header[column]!r}: NaN and infinite values are not allowed",
        )
    return parsed


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _features_float32(table: np.ndarray, *, label_index: int) -> np.ndarray:
    """Copy every column but the label into float32 without a float64 intermediate."""
    n_rows, n_columns = table.shape
    X = np.empty((n_rows, n_columns - 1), dtype=np.float32)
    with np.errstate(over="ignore"):
        X[:, :label_index] = table[:, :label_index]
        X[:, label_index:] = table[:, label_index + 1 :]
    return X


def _structure_error(exc: csv.Error, *, line: int) -> DatasetValidationError:
    """Translate the csv module's error without its text, so nothing from the file leaks."""
    if _FIELD_LIMIT_MESSAGE in str(exc):
        return DatasetValidationError(
            "field-too-long", f"line {line}: a quoted field is far too long"
        )
    return DatasetValidationError(
        "malformed-csv",
        f"line {line}: the CSV structure is broken (an unclosed quote, text after a closing "
        "quote, or a bare carriage return)",
    )
