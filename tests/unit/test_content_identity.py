"""The content digest (kernel/datasets/content_identity.py): invariant to how the same rows are written down,
sensitive to any change of the rows themselves. Hypothesis draws the tables; each format is
written in many equivalent ways (line endings, trailing newlines, a BOM, row and column order,
number spellings, member order and compression) that must all give one digest, and changing one
value, dropping a row or duplicating one must change it."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import tempfile
import zipfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kernel.datasets import content_identity
from kernel.datasets.content_identity import DIGEST_VERSION, ContentUnreadable, content_digest, supported_formats
from kernel.ingest.limits import IngestLimits
from tests.unit.ingest.image_fixtures import npz_bytes, png

LIMITS = IngestLimits()
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def digest(data: bytes, fmt: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"upload.{fmt}"
        path.write_bytes(data)
        return content_digest(path, fmt=fmt, limits=LIMITS)


# ------------------------------------------------------------------------------ CSV


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
numbers = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.integers(-(10**6), 10**6)
words = st.text(alphabet="abcxyz ", min_size=1, max_size=6).map(str.strip).filter(lambda w: w != "")


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[str], list[list[object]]]:
    """A header of distinct names and 1..12 rows of numbers and words (a column keeps one kind)."""
    header = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    kinds = [draw(st.sampled_from(["number", "word"])) for _ in header]
    n_rows = draw(st.integers(1, 12))
    rows = [[draw(numbers if kind == "number" else words) for kind in kinds] for _ in range(n_rows)]
    return header, rows


def spell(value: object, style: int) -> str:
    """One number, spelled one of several ways that all read as the same value."""
    if isinstance(value, str):
        return value
    number = float(value)  # type: ignore[arg-type]
    if style == 0:
        return repr(value)
    if style == 1:
        return f"{number:.17g}"
    if number.is_integer() and abs(number) < 1e15:
        return f"{int(number)}.0" if style == 2 else f"{int(number)}e0"
    return repr(number)


def csv_text(header: list[str], rows: list[list[object]], *, style: int = 0) -> str:
    lines = [",".join(header)] + [",".join(spell(v, style) for v in row) for row in rows]
    return "\n".join(lines) + "\n"


@PROPERTY
@given(
    table=tables(),
    seed=st.integers(0, 2**32 - 1),
    crlf=st.booleans(),
    trailing=st.integers(0, 3),
    bom=st.booleans(),
    style=st.integers(0, 3),
)
def test_csv_digest_ignores_how_the_same_rows_are_written(
    table: tuple[list[str], list[list[object]]], seed: int, crlf: bool, trailing: int, bom: bool, style: int
) -> None:
    header, rows = table
    rng = np.random.default_rng(seed)
    columns = list(rng.permutation(len(header)))
    shuffled = [[row[c] for c in columns] for row in (rows[i] for i in rng.permutation(len(rows)))]
    text = csv_text([header[c] for c in columns], shuffled, style=style)
    text = text.rstrip("\n") + "\n" * trailing if trailing else text.rstrip("\n")
    if crlf:
        text = text.replace("\n", "\r\n")
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode()
    assert digest(data, "csv") == digest(csv_text(header, rows).encode(), "csv")


@PROPERTY
@given(table=tables(), data=st.data())
def test_csv_digest_changes_with_any_value_row_or_name(
    table: tuple[list[str], list[list[object]]], data: st.DataObject
) -> None:
    header, rows = table
    original = digest(csv_text(header, rows).encode(), "csv")
    row, column = data.draw(st.integers(0, len(rows) - 1)), data.draw(st.integers(0, len(header) - 1))
    changed = [list(r) for r in rows]
    old = changed[row][column]
    new = data.draw(numbers if not isinstance(old, str) else words)
    assume(spell(new, 0) != spell(old, 0) and not (not isinstance(old, str) and float(new) == float(old)))  # type: ignore[arg-type]
    changed[row][column] = new
    assert digest(csv_text(header, changed).encode(), "csv") != original
    assert digest(csv_text(header, rows + [rows[row]]).encode(), "csv") != original  # a duplicate row counts
    if len(rows) > 1:
        assert digest(csv_text(header, rows[:row] + rows[row + 1 :]).encode(), "csv") != original
    renamed = list(header)
    renamed[column] = renamed[column] + "_x"
    assume(len(set(renamed)) == len(renamed))
    assert digest(csv_text(renamed, rows).encode(), "csv") != original


@PROPERTY
@given(values=st.lists(numbers, min_size=1, max_size=30), style=st.integers(0, 3))
def test_the_vectorised_number_columns_write_exactly_each_fields_bytes(values: list[object], style: int) -> None:
    """Columns of numbers take a numpy path: it must produce the very bytes of the per-field path."""
    cells = tuple(spell(value, style) for value in values)
    frames = content_identity._column_frames(cells, {})
    assert isinstance(frames, np.ndarray)
    assert [frames[row].tobytes() for row in range(len(cells))] == [content_identity._field(c) for c in cells]


@PROPERTY
@given(table=tables(), chunk=st.integers(1, 5))
def test_reading_in_chunks_does_not_change_the_digest(table: tuple[list[str], list[list[object]]], chunk: int) -> None:
    header, rows = table
    body = csv_text(header, rows).encode()
    whole = digest(body, "csv")
    with mock.patch.object(content_identity, "_CSV_CHUNK_ROWS", chunk):
        assert digest(body, "csv") == whole


def test_csv_values_are_paired_with_their_column_names() -> None:
    """Swapping two columns' names (not their order) is other content, though the cells are the same."""
    assert digest(b"a,b\n1,2\n", "csv") != digest(b"b,a\n1,2\n", "csv")
    assert digest(b"a,b\n1,2\n", "csv") == digest(b"b,a\n2,1\n", "csv")


def test_csv_spaces_around_text_and_numbers_are_not_content() -> None:
    """The ingest reads `` 1 `` as 1 and compares labels and categories without surrounding spaces."""
    assert digest(b"x,label\n1,cat\n", "csv") == digest(b"x,label\n 1 , cat \n", "csv")
    assert digest(b"x,label\n-0,cat\n", "csv") == digest(b"x,label\n0.0,cat\n", "csv")


def _frame(tag: bytes, payload: bytes) -> bytes:
    return tag + len(payload).to_bytes(8, "big") + payload


def test_golden_digest_pins_the_canonical_form() -> None:
    """The documented form, re-derived by hand: each row's (name, value) pairs sorted by name, a
    number by its IEEE double, the row hashes sorted, hashed with the version, the family and n.
    Every stored digest depends on it: changing it needs a new DIGEST_VERSION (and stored digests
    recomputed), never an edit of v1."""
    rows = (
        _frame(b"c", b"label") + _frame(b"s", b"a") + _frame(b"c", b"x") + _frame(b"f", struct.pack(">d", 1.5)),
        _frame(b"c", b"label") + _frame(b"s", b"b") + _frame(b"c", b"x") + _frame(b"f", struct.pack(">d", 2.0)),
    )
    hashed = sorted(hashlib.sha256(row).digest() for row in rows)
    expected = hashlib.sha256(b"privtrain-content-v1\0table\0" + (2).to_bytes(8, "big") + b"".join(hashed))
    assert DIGEST_VERSION == b"privtrain-content-v1"
    assert digest(b"x,label\n1.5,a\n2,b\n", "csv") == expected.hexdigest()
    assert expected.hexdigest() == "7a755515a3a82ba5d164c006d40f301587ca0d7729dce16182cef230e36e230d"


# ------------------------------------------------------------------------------ JSON Lines


records = st.lists(
    st.dictionaries(
        names, st.one_of(st.text(max_size=8), st.integers(-100, 100), st.booleans(), st.none()), min_size=1, max_size=4
    ),
    min_size=1,
    max_size=10,
)


def jsonl_text(items: list[dict[str, object]]) -> str:
    return "".join(json.dumps(item) + "\n" for item in items)


@PROPERTY
@given(items=records, seed=st.integers(0, 2**32 - 1), crlf=st.booleans(), blank=st.integers(0, 2))
def test_jsonl_digest_ignores_record_and_member_order_and_line_endings(
    items: list[dict[str, object]], seed: int, crlf: bool, blank: int
) -> None:
    rng = np.random.default_rng(seed)
    reordered = [dict(reversed(list(items[i].items()))) for i in rng.permutation(len(items))]
    text = jsonl_text(reordered) + "\n" * blank
    if crlf:
        text = text.replace("\n", "\r\n")
    assert digest(text.encode(), "jsonl") == digest(jsonl_text(items).encode(), "jsonl")


@PROPERTY
@given(items=records, data=st.data())
def test_jsonl_digest_changes_with_any_member_value(items: list[dict[str, object]], data: st.DataObject) -> None:
    row = data.draw(st.integers(0, len(items) - 1))
    member = data.draw(st.sampled_from(sorted(items[row])))
    new = data.draw(st.text(min_size=1, max_size=8))
    assume(new != items[row][member])
    changed = [dict(item) for item in items]
    changed[row][member] = new
    assert digest(jsonl_text(changed).encode(), "jsonl") != digest(jsonl_text(items).encode(), "jsonl")


# ------------------------------------------------------------------------------ NPZ


@PROPERTY
@given(
    n_rows=st.integers(1, 20),
    n_features=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_npz_digest_ignores_row_order_and_dtype_widening(
    n_rows: int, n_features: int, seed: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_rows, n_features)).astype(np.float32)  # float32 values: exact in float64
    y = rng.integers(0, 3, n_rows)
    order = rng.permutation(n_rows)
    base = digest(npz_bytes(X=X, y=y), "npz")
    assert digest(npz_bytes(X=X[order].astype(np.float64), y=y[order].astype(np.float32)), "npz") == base
    row, column = data.draw(st.integers(0, n_rows - 1)), data.draw(st.integers(0, n_features - 1))
    changed = X.copy()
    changed[row, column] = np.nextafter(changed[row, column], np.float32(np.inf))
    assert digest(npz_bytes(X=changed, y=y), "npz") != base
    relabelled = y.copy()
    relabelled[row] = (relabelled[row] + 1) % 3
    assert digest(npz_bytes(X=X, y=relabelled), "npz") != base


# ------------------------------------------------------------------------------ image ZIP


def image_members(seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {
        f"{label}/{i}.png": png(rng.integers(0, 256, (4, 4), dtype=np.uint8))
        for label in ("cat", "dog")
        for i in range(3)
    }


def zipped(members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@PROPERTY
@given(seed=st.integers(0, 1000), order_seed=st.integers(0, 2**32 - 1), stored=st.booleans())
def test_zip_digest_ignores_member_order_names_and_compression(seed: int, order_seed: int, stored: bool) -> None:
    members = image_members(seed)
    names_in_order = [list(members)[i] for i in np.random.default_rng(order_seed).permutation(len(members))]
    renamed = {f"{name.split('/')[0]}/renamed-{k}.png": members[name] for k, name in enumerate(names_in_order)}
    compression = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    junk = {"__MACOSX/cat/._0.png": b"junk", "cat/.DS_Store": b"junk"}
    assert digest(zipped({**renamed, **junk}, compression=compression), "zip") == digest(zipped(members), "zip")


def test_zip_digest_changes_with_an_image_or_a_label() -> None:
    members = image_members(0)
    base = digest(zipped(members), "zip")
    moved = dict(members)
    moved["dog/0-moved.png"] = moved.pop("cat/0.png")  # the same image, another class
    assert digest(zipped(moved), "zip") != base
    other = dict(members)
    other["cat/0.png"] = png(np.zeros((4, 4), dtype=np.uint8))
    assert digest(zipped(other), "zip") != base


# ------------------------------------------------------------------------------ all formats


def test_every_upload_format_has_a_digest() -> None:
    assert set(supported_formats()) == {"csv", "npz", "zip", "jsonl"}


@pytest.mark.parametrize(
    ("fmt", "data"),
    [("csv", b"a,b\n1,2,3\n"), ("jsonl", b"[1, 2]\n"), ("npz", b"not a zip"), ("zip", b"not a zip"), ("parquet", b"")],
)
def test_unreadable_content_is_refused_without_quoting_it(fmt: str, data: bytes) -> None:
    with pytest.raises(ContentUnreadable) as refused:
        digest(data, fmt)
    assert "1, 2" not in str(refused.value) and "1,2,3" not in str(refused.value)
