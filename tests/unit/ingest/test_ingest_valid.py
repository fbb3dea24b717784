"""Valid uploads parse to exactly the arrays that were written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_diabetes, load_digits  # type: ignore[import-untyped]

from kernel.ingest import (
    SUPPORTED_FORMATS,
    ClassList,
    DatasetValidationError,
    IngestLimits,
    ParsedDataset,
    dataset_facts,
    parse_dataset,
)

LIMITS = IngestLimits()


def _write_table(path: Path, *, X: np.ndarray, y: np.ndarray, label_at: int, newline: str = "\n") -> list[str]:
    """Write X and y as CSV with the label column inserted at `label_at`; return the header."""
    names = [f"pixel_{j}" for j in range(X.shape[1])]
    header = names[:label_at] + ["label"] + names[label_at:]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator=newline)
        writer.writerow(header)
        for features, label in zip(X.tolist(), y.tolist(), strict=True):
            cells = [repr(float(v)) for v in features]
            writer.writerow(cells[:label_at] + [repr(label)] + cells[label_at:])
    return names


def _parse_csv(path: Path, *, task: str | None = None) -> ParsedDataset:
    return parse_dataset(path, fmt="csv", label_column="label", task=task, limits=LIMITS)


def _parse_npz(path: Path, *, task: str | None = None) -> ParsedDataset:
    return parse_dataset(path, fmt="npz", label_column=None, task=task, limits=LIMITS)


@pytest.fixture(scope="module")
def digits_csv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    digits = load_digits()
    path = tmp_path_factory.mktemp("digits") / "digits.csv"
    names = _write_table(path, X=digits.data, y=digits.target, label_at=digits.data.shape[1])
    return path, names


def test_supported_formats() -> None:
    assert SUPPORTED_FORMATS == ("csv", "npz")


def test_digits_csv_round_trips_exactly(digits_csv: tuple[Path, list[str]]) -> None:
    path, names = digits_csv
    digits = load_digits()
    parsed = _parse_csv(path)
    assert parsed.X.dtype == np.float32 and parsed.X.flags.c_contiguous
    np.testing.assert_array_equal(parsed.X, digits.data.astype(np.float32))
    assert parsed.y.dtype == np.int64
    np.testing.assert_array_equal(parsed.y, digits.target)
    assert parsed.task == "classification"
    assert parsed.n_classes == 10
    assert parsed.feature_shape == (64,)
    assert parsed.feature_names == tuple(names)


def test_label_column_in_the_middle_is_removed_from_features(tmp_path: Path) -> None:
    digits = load_digits()
    path = tmp_path / "middle.csv"
    names = _write_table(path, X=digits.data[:50], y=digits.target[:50], label_at=10)
    parsed = _parse_csv(path)
    np.testing.assert_array_equal(parsed.X, digits.data[:50].astype(np.float32))
    np.testing.assert_array_equal(parsed.y, digits.target[:50])
    assert parsed.feature_names == tuple(names)
    assert "label" not in parsed.feature_names


def test_crlf_and_bom_parse_identically(digits_csv: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, _ = digits_csv
    variant = tmp_path / "crlf_bom.csv"
    variant.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    assert variant.read_bytes().count(b"\r\n") == load_digits().data.shape[0] + 1
    plain, crlf = _parse_csv(path), _parse_csv(variant)
    np.testing.assert_array_equal(crlf.X, plain.X)
    np.testing.assert_array_equal(crlf.y, plain.y)
    assert crlf.feature_names == plain.feature_names  # the BOM is not part of the first name
    assert (crlf.task, crlf.n_classes) == (plain.task, plain.n_classes)


def test_quoted_fields(tmp_path: Path) -> None:
    path = tmp_path / "quoted.csv"
    path.write_text(
        '"height, cm","wei""ght",label\n"1.5", 2 ,"0"\n"-3e2","4",1\n',
        encoding="utf-8",
    )
    parsed = _parse_csv(path)
    np.testing.assert_array_equal(parsed.X, np.array([[1.5, 2.0], [-300.0, 4.0]], np.float32))
    np.testing.assert_array_equal(parsed.y, [0, 1])
    assert parsed.feature_names == ("height, cm", 'wei"ght')


def test_single_feature_column_and_trailing_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "one.csv"
    path.write_text("label,x\n0,0.25\n1,-1\n\n\r\n\n", encoding="utf-8")
    parsed = _parse_csv(path)
    assert parsed.X.shape == (2, 1)
    np.testing.assert_array_equal(parsed.X[:, 0], [0.25, -1.0])
    assert parsed.feature_names == ("x",)


def test_no_newline_at_end_of_file(tmp_path: Path) -> None:
    path = tmp_path / "eof.csv"
    path.write_text("a,label\n1,0\n2,1", encoding="utf-8")
    np.testing.assert_array_equal(_parse_csv(path).X[:, 0], [1.0, 2.0])


def test_diabetes_needs_its_task_stated(tmp_path: Path) -> None:
    """Whole-number targets from 25 to 346 could be 214 classes: the owner must say which
    (before issue 14 this was silently inferred as regression, and {1, 2} too)."""
    diabetes = load_diabetes()
    path = tmp_path / "diabetes.csv"
    _write_table(path, X=diabetes.data, y=diabetes.target, label_at=diabetes.data.shape[1])
    with pytest.raises(DatasetValidationError) as refused:
        _parse_csv(path)
    assert refused.value.reason == "ambiguous-task" and "task=regression" in refused.value.detail
    parsed = _parse_csv(path, task="regression")
    assert parsed.task == "regression"
    assert parsed.n_classes is None
    assert parsed.y.dtype == np.float32
    np.testing.assert_array_equal(parsed.y, diabetes.target.astype(np.float32))
    np.testing.assert_array_equal(parsed.X, diabetes.data.astype(np.float32))


def test_integral_float_labels_are_classes(tmp_path: Path) -> None:
    path = tmp_path / "floats.csv"
    path.write_text("a,label\n1,0.0\n2,3.0\n3,1e0\n", encoding="utf-8")
    parsed = _parse_csv(path)
    assert (parsed.task, parsed.n_classes) == ("classification", 4)
    np.testing.assert_array_equal(parsed.y, [0, 3, 1])


def test_labels_not_starting_at_zero_need_a_task_and_are_then_names(tmp_path: Path) -> None:
    """{1, 2} is ambiguous; as classification the values are names: 2 classes, never an empty
    class 0 (before issue 14: regression when inferred, 3 classes when asked)."""
    path = tmp_path / "one_based.csv"
    path.write_text("a,label\n1,1\n2,2\n3,2\n", encoding="utf-8")
    with pytest.raises(DatasetValidationError) as refused:
        _parse_csv(path)
    assert refused.value.reason == "ambiguous-task"
    asked = _parse_csv(path, task="classification")
    assert (asked.task, asked.n_classes) == ("classification", 2)
    assert asked.classes == ClassList(names=("1", "2"), declared=False)
    np.testing.assert_array_equal(asked.y, [0, 1, 1])
    assert _parse_csv(path, task="regression").task == "regression"


def test_explicit_regression_on_class_labels(digits_csv: tuple[Path, list[str]]) -> None:
    parsed = _parse_csv(digits_csv[0], task="regression")
    assert (parsed.task, parsed.n_classes) == ("regression", None)
    assert parsed.y.dtype == np.float32
    np.testing.assert_array_equal(parsed.y, load_digits().target.astype(np.float32))


@pytest.mark.parametrize(
    ("shape", "dtype", "expected_feature_shape"),
    [
        ((30, 7), np.float64, (7,)),
        ((30, 5, 6), np.uint8, (1, 5, 6)),
        ((30, 3, 4, 5), np.float32, (3, 4, 5)),
        ((30, 4), np.bool_, (4,)),
        ((30, 2, 3), np.int64, (1, 2, 3)),
    ],
)
def test_npz_shapes(
    tmp_path: Path,
    shape: tuple[int, ...],
    dtype: type[np.generic],
    expected_feature_shape: tuple[int, ...],
) -> None:
    rng = np.random.default_rng(0)
    X = (rng.normal(size=shape) * 50).astype(dtype)
    y = np.arange(30) % 3
    path = tmp_path / "data.npz"
    np.savez_compressed(path, X=X, y=y, notes=np.zeros(3))  # extra members are ignored
    parsed = _parse_npz(path)
    assert parsed.feature_shape == expected_feature_shape
    assert parsed.X.shape == (30, *expected_feature_shape)
    assert parsed.X.dtype == np.float32 and parsed.X.flags.c_contiguous
    np.testing.assert_array_equal(parsed.X.reshape(X.shape), X.astype(np.float32))
    np.testing.assert_array_equal(parsed.y, y)
    assert (parsed.task, parsed.n_classes, parsed.feature_names) == ("classification", 3, None)


def test_npz_fortran_order_and_float_labels(tmp_path: Path) -> None:
    X = np.asfortranarray(np.arange(24, dtype=np.float64).reshape(6, 4))
    y = np.linspace(-1.0, 1.0, 6)
    path = tmp_path / "fortran.npz"
    np.savez(path, X=X, y=y)
    parsed = _parse_npz(path)
    assert parsed.X.flags.c_contiguous
    np.testing.assert_array_equal(parsed.X, X.astype(np.float32))
    assert parsed.task == "regression"
    np.testing.assert_array_equal(parsed.y, y.astype(np.float32))


def test_npz_ignores_label_column(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, X=np.ones((4, 2)), y=np.array([0, 1, 0, 1]))
    parsed = parse_dataset(path, fmt="npz", label_column="label", task=None, limits=LIMITS)
    np.testing.assert_array_equal(parsed.y, [0, 1, 0, 1])


def test_dataset_facts_are_plain_public_values(tmp_path: Path) -> None:
    path = tmp_path / "images.npz"
    np.savez(path, X=np.zeros((8, 3, 4, 4), np.float32), y=np.arange(8) % 4)
    facts = dataset_facts(_parse_npz(path))
    assert facts == {
        "n_rows": 8,
        "feature_shape": (3, 4, 4),
        "n_features": 48,
        "task": "classification",
        "n_classes": 4,
        "n_units": None,
    }
    assert json.loads(json.dumps(facts))["feature_shape"] == [3, 4, 4]


def test_repr_does_not_print_values(tmp_path: Path) -> None:
    path = tmp_path / "secret.csv"
    path.write_text("a,label\n42,0\n7,1\n", encoding="utf-8")
    parsed = _parse_csv(path)
    assert "42." in repr(parsed.X)
    assert "42." not in repr(parsed)
    assert "feature_shape=(1,)" in repr(parsed)
