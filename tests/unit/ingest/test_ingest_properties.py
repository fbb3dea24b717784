"""Property: any finite float matrix with integer labels survives a CSV round trip."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kernel.ingest import DatasetValidationError, IngestLimits, parse_dataset

finite_float32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def tables(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    n_rows = draw(st.integers(2, 20))
    n_features = draw(st.integers(1, 6))
    X = draw(hnp.arrays(np.float64, (n_rows, n_features), elements=finite_float32))
    y = draw(hnp.arrays(np.int64, (n_rows,), elements=st.integers(0, 9)))
    # At least two classes, one of them 0, so that inference must say classification.
    zero_at = draw(st.integers(0, n_rows - 1))
    other_at = (zero_at + draw(st.integers(1, n_rows - 1))) % n_rows
    y[zero_at], y[other_at] = 0, draw(st.integers(1, 9))
    label_at = draw(st.integers(0, n_features))
    return X, y, label_at


@settings(database=None, max_examples=60, deadline=None)
@given(table=tables(), crlf=st.booleans(), quote_all=st.booleans())
def test_csv_round_trip(table: tuple[np.ndarray, np.ndarray, int], crlf: bool, quote_all: bool) -> None:
    X, y, label_at = table
    names = [f"f{j}" for j in range(X.shape[1])]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(
                handle,
                lineterminator="\r\n" if crlf else "\n",
                quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL,
            )
            writer.writerow(names[:label_at] + ["label"] + names[label_at:])
            for features, label in zip(X.tolist(), y.tolist(), strict=True):
                cells = [repr(v) for v in features]
                writer.writerow(cells[:label_at] + [str(label)] + cells[label_at:])
        parsed = parse_dataset(path, fmt="csv", label_column="label", task=None, limits=IngestLimits())
    assert parsed.task == "classification"
    np.testing.assert_array_equal(parsed.X, X.astype(np.float32))
    np.testing.assert_array_equal(parsed.y, y)
    assert parsed.n_classes == int(y.max()) + 1
    assert parsed.feature_names == tuple(names)


csv_bytes = st.lists(
    st.sampled_from([b'"', b",", b"\r", b"\n", b" ", b"1", b"-2.5", b"e9", b"nan", b"label", b"\xff"]),
    max_size=40,
).map(b"".join)


@settings(database=None, max_examples=200, deadline=None)
@given(body=csv_bytes)
def test_arbitrary_csv_bytes_parse_or_raise_a_validation_error(body: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.csv"
        path.write_bytes(b"a,label\n" + body)
        try:
            parsed = parse_dataset(path, fmt="csv", label_column="label", task=None, limits=IngestLimits())
        except DatasetValidationError:
            return
    assert parsed.X.shape == (parsed.y.shape[0], 1)
