"""CSV reader: a UTF-8 file with a header row, streamed row by row into a float matrix."""

from __future__ import annotations

import codecs
import csv
import difflib
import json
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kernel.ingest.columns import ColumnPlan, plan_columns
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.limits import IngestLimits
from kernel.ingest.numeric import first_non_finite
from kernel.ingest.parse_control import checkpoint
from kernel.ingest.preparation import Preparation
from kernel.ingest.registry import RawDataset, RawLabels, RowPositions, TextLabels, register_reader

_BOM = codecs.BOM_UTF8
_FIELD_LIMIT_MESSAGE = "field larger than field limit"
_LINES_PER_CHECKPOINT = 256
"""Lines between two looks at the parse's deadline and its client (kernel/ingest/parse_control.py)."""


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
            if not self.line_number % _LINES_PER_CHECKPOINT:
                checkpoint()
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
    raise DatasetValidationError("bad-encoding", f"line {line_number} is not valid UTF-8 (byte {bad_byte} of the line)")


def _line_budget(n_fields: int, limits: IngestLimits) -> int:
    """Most bytes one physical line of a valid file can hold.

    Per field: up to 4 UTF-8 bytes per character, quotes doubled inside a quoted field (a quote
    is one byte, so 4 per character still covers it), two enclosing quotes and a comma; plus a
    CRLF and a possible BOM.
    """
    return n_fields * (4 * limits.max_field_chars + 3) + 2 + len(_BOM)


@register_reader("csv")
def read_csv(
    path: Path,
    *,
    label_column: str | None,
    limits: IngestLimits,
    preparation: Preparation | None,
    unit_column: str | None = None,
) -> RawDataset:
    """Parse a CSV upload. Feature fields must be finite numbers unless the owner declared their
    column dropped (never read) or one-hot encoded; labels may be numbers or text. With
    ``unit_column`` each row's field there names its privacy unit (any non-empty text)."""
    if label_column is None:
        raise DatasetValidationError("missing-label-column", "a CSV dataset needs label_column; none was given")
    with open(path, "rb") as stream:
        lines = _Utf8Lines(stream, max_line_bytes=_line_budget(limits.max_features + 1, limits))
        reader = csv.reader(lines, strict=True)
        try:
            header = _read_header(reader, label_column=label_column, limits=limits)
            plan = plan_columns(
                header, label_column=label_column, preparation=preparation, limits=limits, unit_column=unit_column
            )
            lines.max_line_bytes = _line_budget(len(header), limits)
            body = _read_body(reader, lines=lines, header=header, plan=plan, limits=limits)
        except csv.Error as exc:
            raise _structure_error(exc, line=lines.line_number) from None

    rows = RowPositions(line_numbers=np.frombuffer(body.line_numbers, dtype=np.int64).copy())
    X = body.features(plan)
    bad = first_non_finite(X)
    if bad is not None:
        row, column = bad
        raise DatasetValidationError(
            "non-finite",
            f"{rows.describe(row)}, column {plan.feature_names[column]!r}: the number is too large for float32",
        )
    return RawDataset(
        X=X,
        labels=body.labels(),
        feature_names=plan.feature_names,
        rows=rows,
        scaling=plan.scaling,
        units=body.units() if plan.unit_position is not None else None,
    )


def _read_header(reader: Iterator[list[str]], *, label_column: str, limits: IngestLimits) -> tuple[str, ...]:
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
    header_chars = sum(map(len, header))
    if header_chars > limits.max_header_chars:
        raise DatasetValidationError(
            "header-too-long",
            f"the header's names have {header_chars} characters together; at most "
            f"{limits.max_header_chars} are allowed (shorter column names fit more columns)",
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
                f"column name {name!r} appears twice in the header, at columns {positions[name]} and {position}",
            )
        positions[name] = position
    if label_column not in positions:
        raise DatasetValidationError("missing-label-column", _missing_label_detail(label_column, header))
    if len(header) == 1:
        raise DatasetValidationError("empty-dataset", "the header has no feature columns besides the label column")
    return tuple(header)


_LABEL_CACHE_PER_CLASS = 8
"""Raw label fields remembered per possible class (spacing variants of one name each count)."""


class _Body:
    """What the data rows hold, in flat typed buffers (8 bytes a value, not a Python object each)."""

    def __init__(self, *, max_classes: int, label_column: str) -> None:
        self.numbers: array[float] = array("d")
        """The numeric feature fields, row after row."""
        self.categories: array[int] = array("q")
        """Each one-hot field's category offset, row after row."""
        self.label_numbers: array[float] = array("d")
        """Each label as a number; NaN where it is text."""
        self.label_codes: array[int] | None = array("q")
        self.label_texts: dict[str, int] = {}
        """Distinct label texts (trimmed), kept while a class list could hold them (max_classes)."""
        self.line_numbers: array[int] = array("q")
        self.unit_codes: array[int] = array("q")
        """Each row's privacy unit, as the position of its identifier in ``unit_ids``."""
        self.unit_ids: dict[str, int] = {}
        self._max_classes = max_classes
        self._label_column = label_column
        self._seen: dict[str, tuple[float, int]] = {}
        """Raw label field → (number, code): a class label is parsed once, not once per row."""

    def add_label(self, field: str, *, line: int) -> None:
        seen = self._seen.get(field)
        if seen is None:
            seen = self._first_sight(field, line=line)
        number, code = seen
        self.label_numbers.append(number)
        if self.label_codes is not None:
            self.label_codes.append(code)

    def _first_sight(self, field: str, *, line: int) -> tuple[float, int]:
        number = _label_number(field, column=self._label_column, line=line)
        if self.label_codes is None:
            return number, -1
        text = field.strip()
        code = self.label_texts.get(text)
        if code is None:
            if len(self.label_texts) > self._max_classes:  # more than any class list: numbers only
                self.label_codes, self.label_texts, self._seen = None, {}, {}
                return number, -1
            code = self.label_texts[text] = len(self.label_texts)
        if len(self._seen) < _LABEL_CACHE_PER_CLASS * (self._max_classes + 1):
            self._seen[field] = (number, code)
        return number, code

    def labels(self) -> RawLabels:
        codes = self.label_codes
        return RawLabels(
            numbers=np.frombuffer(self.label_numbers, dtype=np.float64).copy(),
            texts=TextLabels(
                codes=np.frombuffer(codes, dtype=np.int64).copy() if codes is not None else None,
                distinct=tuple(self.label_texts),
            ),
        )

    def add_unit(self, field: str, *, column: str, line: int) -> None:
        unit = field.strip()
        if not unit:
            raise DatasetValidationError(
                "missing-privacy-unit",
                f"line {line}, column {column!r}: the privacy unit is empty; every row must name the unit "
                "(e.g. the person) it belongs to",
            )
        code = self.unit_ids.get(unit)
        if code is None:
            code = self.unit_ids[unit] = len(self.unit_ids)
        self.unit_codes.append(code)

    def units(self) -> np.ndarray:
        return np.frombuffer(self.unit_codes, dtype=np.int64).copy()

    def features(self, plan: ColumnPlan) -> np.ndarray:
        """The float32 feature matrix: numbers where the plan puts them, one-hot groups as 0/1."""
        n_rows = len(self.line_numbers)
        X = np.zeros((n_rows, plan.n_features), dtype=np.float32)
        numbers = np.frombuffer(self.numbers, dtype=np.float64).reshape(n_rows, len(plan.numeric_positions))
        with np.errstate(over="ignore"):
            X[:, plan.numeric_features] = numbers
        categories = np.frombuffer(self.categories, dtype=np.int64).reshape(n_rows, len(plan.one_hot))
        every_row = np.arange(n_rows)
        for group, column in enumerate(plan.one_hot):
            X[every_row, column.first_feature + categories[:, group]] = 1.0
        return X


def _fields_at(positions: tuple[int, ...]) -> Callable[[list[str]], Sequence[str]]:
    """The fields at ``positions`` of a row, as fast as itemgetter allows."""
    if len(positions) >= 2:
        return itemgetter(*positions)
    if positions:
        (only,) = positions
        return lambda row: (row[only],)
    return lambda row: ()


def _read_body(
    reader: Iterator[list[str]],
    *,
    lines: _Utf8Lines,
    header: tuple[str, ...],
    plan: ColumnPlan,
    limits: IngestLimits,
) -> _Body:
    """Every data row into typed buffers. The loop is the hot path (a million rows): checks that
    pass cost one expression each, and the error wording lives in helpers called on failure."""
    body = _Body(max_classes=limits.max_classes, label_column=header[plan.label_position])
    numeric_fields = _fields_at(plan.numeric_positions)
    n_fields, max_chars, label_position = len(header), limits.max_field_chars, plan.label_position
    unit_position = plan.unit_position
    isfinite = math.isfinite
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
        if len(body.line_numbers) == limits.max_rows:
            raise DatasetValidationError(
                "too-many-rows",
                f"line {line}: the file has more than {limits.max_rows} data rows",
            )
        if len(row) != n_fields or max(map(len, row)) > max_chars:
            raise _shape_error(row, header=header, line=line, limits=limits)
        fields = numeric_fields(row)
        try:
            parsed = list(map(float, fields))
        except ValueError:
            parsed = None  # the error message quotes the field, so it must not become a cause
        if parsed is None or not all(map(isfinite, parsed)):
            raise _number_error(fields, plan=plan, header=header, line=line)
        body.numbers.extend(parsed)
        if plan.one_hot:
            body.categories.extend(_categories(row, plan=plan, line=line))
        body.add_label(row[label_position], line=line)
        if unit_position is not None:
            body.add_unit(row[unit_position], column=header[unit_position], line=line)
        body.line_numbers.append(line)
    if not body.line_numbers:
        raise DatasetValidationError("empty-dataset", "the header is followed by no data rows")
    return body


def _shape_error(row: list[str], *, header: tuple[str, ...], line: int, limits: IngestLimits) -> DatasetValidationError:
    if len(row) != len(header):
        return DatasetValidationError(
            "ragged-row", f"line {line} has {len(row)} fields where the header has {len(header)}"
        )
    column = next(i for i, field in enumerate(row) if len(field) > limits.max_field_chars)
    return DatasetValidationError(
        "field-too-long",
        f"line {line}, column {header[column]!r}: the field is longer than {limits.max_field_chars} characters",
    )


def _number_error(
    fields: Sequence[str], *, plan: ColumnPlan, header: tuple[str, ...], line: int
) -> DatasetValidationError:
    """The first field that is not a number, else the first that is not finite."""
    for position, field in zip(plan.numeric_positions, fields, strict=True):
        if not field.strip():
            return DatasetValidationError(
                "empty-field",
                f"line {line}, column {header[position]!r} is empty: every feature needs a "
                "number (fill or drop the rows with missing values before upload)",
            )
        if not _is_number(field):
            return DatasetValidationError("non-numeric", _non_numeric_detail(header[position], line=line))
    position = next(
        p for p, field in zip(plan.numeric_positions, fields, strict=True) if not math.isfinite(float(field))
    )
    return DatasetValidationError(
        "non-finite",
        f"line {line}, column {header[position]!r}: NaN and infinite values are not allowed",
    )


MAX_LISTED_COLUMNS = 20


def _missing_label_detail(label_column: str, header: Sequence[str]) -> str:
    """Which columns were found (the header is public schema), with a hint for the usual causes:
    a near-miss of the name, or a file separated by semicolons read as one column."""
    if len(header) == 1 and header[0].count(";") >= 1:
        return (
            f"label column {label_column!r} was not found: the header is a single column holding "
            f"{header[0].count(';') + 1} names separated by ';'. This file looks semicolon-separated; "
            "save it with commas as separators (the format is RFC 4180 CSV)"
        )
    listed = ", ".join(repr(name) for name in header[:MAX_LISTED_COLUMNS])
    more = f" and {len(header) - MAX_LISTED_COLUMNS} more" if len(header) > MAX_LISTED_COLUMNS else ""
    close = difflib.get_close_matches(label_column, list(header), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"label column {label_column!r} is not among the {len(header)} header columns ({listed}{more}){hint}"


def _non_numeric_detail(column: str, *, line: int) -> str:
    """Names the column and the owner's choices; the field itself (private) is never quoted."""
    name = json.dumps(column)
    return (
        f"line {line}, column {column!r}: the field is not a number. Declare at upload what to do "
        f'with a text column, in preparation=: leave it out with {{"drop": [{name}]}}, or encode it '
        f'one-hot over categories you declare public with {{"one_hot": {{{name}: ["category 1", '
        '"category 2"]}}. Naming a column that identifies a person as the privacy unit (one person, '
        "several rows) is planned but not yet available."
    )


def _categories(row: list[str], *, plan: ColumnPlan, line: int) -> list[int]:
    codes: list[int] = []
    for column in plan.one_hot:
        code = column.categories.get(row[column.position].strip())
        if code is None:
            raise DatasetValidationError(
                "unknown-category",
                f"line {line}, column {column.name!r}: the field is not one of the "
                f"{len(column.categories)} categories declared for it in preparation.one_hot "
                "(compared as text, after trimming spaces)",
            )
        codes.append(code)
    return codes


def _label_number(field: str, *, column: str, line: int) -> float:
    """The label as a number, or NaN when it is text (a class name); non-finite numbers are refused."""
    try:
        number = float(field)
    except ValueError:
        return math.nan
    if not math.isfinite(number):
        raise DatasetValidationError(
            "non-finite", f"line {line}, column {column!r}: NaN and infinite values are not allowed"
        )
    return number


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _structure_error(exc: csv.Error, *, line: int) -> DatasetValidationError:
    """Translate the csv module's error without its text, so nothing from the file leaks."""
    if _FIELD_LIMIT_MESSAGE in str(exc):
        return DatasetValidationError("field-too-long", f"line {line}: a quoted field is far too long")
    return DatasetValidationError(
        "malformed-csv",
        f"line {line}: the CSV structure is broken (an unclosed quote, text after a closing "
        "quote, or a bare carriage return)",
    )
