"""Every reason code: a crafted upload that triggers it, a detail that locates the problem, and
no cell value in the detail (cells hold private data)."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from kernel.ingest import IMAGE_REASONS, REASONS, DatasetValidationError, IngestLimits, parse_dataset, parse_preparation

SECRET = "SECRET123"
SECRET_NUMBER = "13371337"


def _text(content: str) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        path = directory / "data.csv"
        path.write_text(content, encoding="utf-8")
        return path

    return write


def _bytes(content: bytes) -> Callable[[Path], Path]:
    def write(directory: Path) -> Path:
        path = directory / "data.bin"
        path.write_bytes(content)
        return path

    return write


def _npz(arrays: dict[str, np.ndarray]) -> Callable[[Path], Path]:
    """What numpy.savez writes: one .npy member per array."""

    def write(directory: Path) -> Path:
        path = directory / "data.npz"
        with zipfile.ZipFile(path, "w") as archive:
            for name, array in arrays.items():
                with archive.open(f"{name}.npy", "w") as member:
                    np.lib.format.write_array(member, array, allow_pickle=False)
        return path

    return write


@dataclass(frozen=True)
class Case:
    reason: str
    write: Callable[[Path], Path]
    fmt: str = "csv"
    label_column: str | None = "label"
    task: str | None = None
    limits: IngestLimits = field(default_factory=IngestLimits)
    classes: tuple[str, ...] | None = None
    """A class list declared by the owner at upload."""
    preparation: str | None = None
    """The owner's preparation declaration (JSON), as sent at upload."""
    unit_column: str | None = None
    """The privacy unit column declared at upload."""
    detail_names: tuple[str, ...] = ()
    """Substrings the detail must contain: the position of the problem."""
    hidden: tuple[str, ...] = ()
    """Substrings (the offending values) the detail must not contain."""


CASES = [
    Case(
        "missing-privacy-unit-column",
        _text("a,label\n1,0\n"),
        unit_column="patient",
        detail_names=("'patient'",),
    ),
    Case(
        "bad-privacy-unit-column",
        _text("a,patient,label\n1,p1,0\n"),
        unit_column="patient",
        preparation='{"drop": ["patient"]}',
        detail_names=("'patient'", "drop"),
    ),
    Case(
        "missing-privacy-unit",
        _text(f"a,patient,label\n1,{SECRET},0\n2, ,1\n"),
        unit_column="patient",
        detail_names=("line 3", "'patient'"),
        hidden=(SECRET,),
    ),
    Case(
        "privacy-unit-unsupported-format",
        _npz({"X": np.zeros((2, 2), np.float32), "y": np.zeros(2, np.int64)}),
        fmt="npz",
        label_column=None,
        unit_column="patient",
        detail_names=("CSV",),
    ),
    Case(
        "unknown-format",
        _text("a,label\n1,0\n"),
        fmt="parquet",
        detail_names=("csv", "npz"),
    ),
    Case(
        "missing-label-column",
        _text("a,target\n1,0\n2,1\n"),
        detail_names=("'label'", "('a', 'target')"),  # the columns found
    ),
    Case(
        "duplicate-column",
        _text("a,b,a,label\n1,2,3,0\n"),
        detail_names=("'a'", "columns 1 and 3"),
    ),
    Case(
        "ragged-row",
        _text(f"a,b,label\n1,2,0\n1,2,{SECRET},0\n"),
        detail_names=("line 3", "4 fields", "header has 3"),
        hidden=(SECRET,),
    ),
    Case(
        "non-numeric",
        _text(f"a,b,label\n1,2,0\n3,4,1\n5,{SECRET},0\n"),
        detail_names=("line 4", "'b'"),
        hidden=(SECRET,),
    ),
    Case(
        "empty-field",
        _text("a,b,label\n1,2,0\n3,,1\n"),
        detail_names=("line 3", "column 'b' is empty"),
    ),
    Case(
        "non-finite",
        _text(f"a,b,label\n1,2,0\n3,{SECRET_NUMBER}e32,1\n"),  # beyond float32
        detail_names=("line 3", "'b'"),
        hidden=(SECRET_NUMBER,),
    ),
    Case(
        "field-too-long",
        _text(f"a,b,label\n1,2,0\n3,{SECRET_NUMBER}{'0' * 300},1\n"),
        detail_names=("line 3", "'b'", "256"),
        hidden=(SECRET_NUMBER,),
    ),
    Case(
        "bad-encoding",
        _bytes(f"a,b,label\n1,2,0\n3,\xff{SECRET},1\n".encode("latin-1")),
        detail_names=("line 3", "UTF-8"),
        hidden=(SECRET,),
    ),
    Case(
        "too-many-rows",
        _text("a,label\n1,0\n2,1\n3,0\n4,1\n"),
        limits=IngestLimits(max_rows=3),
        detail_names=("line 5", "3 data rows"),
    ),
    Case(
        "too-many-columns",
        _text("a,b,c,label\n1,2,3,0\n"),
        limits=IngestLimits(max_features=2),
        detail_names=("4 columns", "2 feature"),
    ),
    Case(
        "header-too-long",
        _text(f"{'a' * 40},{'b' * 40},label\n1,2,0\n"),
        limits=IngestLimits(max_header_chars=64),
        detail_names=("85 characters", "at most 64"),
    ),
    Case(
        "empty-dataset",
        _text("a,b,label\n\n\n"),
        detail_names=("no data rows",),
    ),
    Case(
        "invalid-npz",
        _bytes(f"a,label\n{SECRET},0\n".encode()),
        fmt="npz",
        detail_names=("zip",),
        hidden=(SECRET,),
    ),
    Case(
        "missing-array",
        _npz({"X": np.ones((3, 2)), "labels": np.arange(3)}),
        fmt="npz",
        detail_names=("y.npy",),
    ),
    Case(
        "too-large-decompressed",
        _npz({"X": np.zeros((100, 10)), "y": np.arange(100) % 2}),
        fmt="npz",
        limits=IngestLimits(max_decompressed_bytes=4000),
        detail_names=("4000",),
    ),
    Case(
        "shape-mismatch",
        _npz({"X": np.ones((5, 3)), "y": np.arange(4) % 2}),
        fmt="npz",
        detail_names=("5 rows", "4"),
    ),
    Case(
        "bad-labels",
        _text(f"a,label\n1,0\n2,{SECRET_NUMBER}.5\n3,1\n"),
        task="classification",
        detail_names=("line 3", "whole numbers"),
        hidden=(SECRET_NUMBER,),
    ),
    Case(
        "unknown-task",
        _text("a,label\n1,0\n2,1\n"),
        task="clustering",
        detail_names=("classification", "regression"),
    ),
    Case(
        "malformed-csv",
        _text(f'a,b,label\n1,2,0\n3,"{SECRET}"4,1\n'),
        detail_names=("line 3",),
        hidden=(SECRET,),
    ),
    Case(
        "bad-class-list",
        _text("a,label\n1,0\n2,1\n"),
        task="regression",
        classes=("no", "yes"),
        detail_names=("task=classification",),
    ),
    Case(
        "label-not-in-classes",
        _text("a,label\n1,0\n2,1\n3,7\n"),
        classes=("a", "b", "c"),
        detail_names=("line 4", "3 classes", "0 to 2"),
        hidden=("7",),
    ),
    Case(
        "ambiguous-task",
        _text(f"a,label\n1,{SECRET_NUMBER}\n2,{SECRET_NUMBER}1\n"),
        detail_names=("task=classification", "task=regression", "classes="),
        hidden=(SECRET_NUMBER,),
    ),
    Case(
        "bad-preparation",
        _text("a,b,label\n1,2,0\n"),
        preparation='{"drop": ["c"]}',
        detail_names=("'c'", "header"),
    ),
    Case(
        "unknown-category",
        _text(f"a,colour,label\n1,red,0\n2,{SECRET},1\n"),
        preparation='{"one_hot": {"colour": ["red", "green"]}}',
        detail_names=("line 3", "'colour'", "2 categories"),
        hidden=(SECRET,),
    ),
]


def _reject(
    path: Path,
    *,
    fmt: str = "csv",
    label_column: str | None = "label",
    task: str | None = None,
    limits: IngestLimits | None = None,
    classes: tuple[str, ...] | None = None,
    preparation: str | None = None,
    unit_column: str | None = None,
) -> DatasetValidationError:
    with pytest.raises(DatasetValidationError) as caught:
        parse_dataset(
            path,
            fmt=fmt,
            label_column=label_column,
            task=task,
            limits=limits or IngestLimits(),
            classes=classes,
            preparation=parse_preparation(preparation, limits=limits or IngestLimits()),
            unit_column=unit_column,
        )
    return caught.value


def test_every_reason_has_a_case() -> None:
    """Image reasons have theirs in test_ingest_images.py."""
    assert sorted(case.reason for case in CASES) == sorted(set(REASONS) - set(IMAGE_REASONS))


def test_a_missing_label_column_suggests_a_near_miss_and_recognises_semicolons(tmp_path: Path) -> None:
    near = tmp_path / "near.csv"
    near.write_text("x1,x2,labels\n1,2,0\n")
    error = _reject(
        near, fmt="csv", label_column="label", task=None, limits=IngestLimits(), classes=None, preparation=None
    )
    assert error.reason == "missing-label-column" and "did you mean 'labels'?" in error.detail
    semicolons = tmp_path / "semicolons.csv"
    semicolons.write_text("x1;x2;label\n1;2;0\n")
    error = _reject(
        semicolons, fmt="csv", label_column="label", task=None, limits=IngestLimits(), classes=None, preparation=None
    )
    assert error.reason == "missing-label-column" and "semicolon-separated" in error.detail


@pytest.mark.parametrize("case", CASES, ids=[case.reason for case in CASES])
def test_reason(case: Case, tmp_path: Path) -> None:
    error = _reject(
        case.write(tmp_path),
        fmt=case.fmt,
        label_column=case.label_column,
        task=case.task,
        limits=case.limits,
        classes=case.classes,
        preparation=case.preparation,
        unit_column=case.unit_column,
    )
    assert error.reason == case.reason, error.detail
    for name in case.detail_names:
        assert name in error.detail
    for value in case.hidden:
        assert value not in error.detail
        assert value not in str(error)


# Variants of the reasons above that exercise other paths to the same code.


def test_missing_label_column_when_none_given(tmp_path: Path) -> None:
    error = _reject(_text("a,label\n1,0\n")(tmp_path), label_column=None)
    assert error.reason == "missing-label-column"


@pytest.mark.parametrize("spelling", ["nan", "NaN", "-nan", "inf", "-inf", "+Infinity", "INF", "-infinity", "1e400"])
def test_non_finite_spellings(spelling: str, tmp_path: Path) -> None:
    error = _reject(_text(f"a,b,label\n1,2,0\n3,{spelling},1\n")(tmp_path))
    assert error.reason == "non-finite"
    assert "line 3" in error.detail and "'b'" in error.detail


@pytest.mark.parametrize("task", [None, "classification", "regression"])
def test_non_finite_label_in_csv(task: str | None, tmp_path: Path) -> None:
    error = _reject(_text("a,label\n1,0\n2,inf\n3,1\n")(tmp_path), task=task)
    assert (error.reason, "line 3" in error.detail) == ("non-finite", True)


def test_regression_label_beyond_float32(tmp_path: Path) -> None:
    path = _text(f"a,label\n1,0.5\n2,{SECRET_NUMBER}e32\n")(tmp_path)
    error = _reject(path, task="regression")
    assert error.reason == "non-finite"
    assert "line 3" in error.detail and SECRET_NUMBER not in error.detail


def test_blank_line_inside_data_is_ragged(tmp_path: Path) -> None:
    error = _reject(_text("a,label\n1,0\n\n2,1\n")(tmp_path))
    assert error.reason == "ragged-row"
    assert "line 3" in error.detail and "0 fields" in error.detail


def test_short_row_is_ragged(tmp_path: Path) -> None:
    error = _reject(_text("a,b,label\n1,2,0\n1,0\n")(tmp_path))
    assert error.reason == "ragged-row"
    assert "line 3 has 2 fields" in error.detail


def test_line_numbers_count_multiline_quoted_fields(tmp_path: Path) -> None:
    # The header spans lines 1-2, the second record lines 4-5 ("2\n" parses as 2) and the bad
    # record lines 6-7: a row is named by the line it starts on.
    error = _reject(_text(f'"a\nb",label\n1,0\n"2\n",1\n"{SECRET}\n",0\n')(tmp_path))
    assert error.reason == "non-numeric"
    assert "line 6" in error.detail


def test_an_empty_field_is_named_as_empty_not_as_text(tmp_path: Path) -> None:
    error = _reject(_text("a,b,label\n1, ,0\n")(tmp_path))
    assert (error.reason, "line 2, column 'b' is empty" in error.detail) == ("empty-field", True)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "empty"),
        ("\na,label\n1,0\n", "line 1"),
        ("label\n1\n2\n", "no feature columns"),
    ],
    ids=["empty-file", "blank-header", "label-only"],
)
def test_empty_csv_variants(content: str, expected: str, tmp_path: Path) -> None:
    error = _reject(_text(content)(tmp_path))
    assert error.reason == "empty-dataset"
    assert expected in error.detail


def test_header_name_too_long(tmp_path: Path) -> None:
    error = _reject(_text(f"a,{'b' * 300},label\n1,2,0\n")(tmp_path))
    assert error.reason == "field-too-long"
    assert "header column 2" in error.detail and "b" * 300 not in error.detail


def test_line_without_newlines_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text("a,label\n" + "1" * 5_000_000, encoding="utf-8")
    error = _reject(path)
    assert error.reason == "field-too-long"
    assert "line 2" in error.detail


def test_bad_encoding_in_header(tmp_path: Path) -> None:
    error = _reject(_bytes(b"a\xc3,label\n1,0\n")(tmp_path))
    assert (error.reason, "line 1" in error.detail) == ("bad-encoding", True)


def test_unclosed_quote_is_malformed(tmp_path: Path) -> None:
    error = _reject(_text('a,label\n1,0\n"2,1\n3,0\n')(tmp_path))
    assert error.reason == "malformed-csv"


def test_bare_carriage_return_is_malformed(tmp_path: Path) -> None:
    error = _reject(_bytes(b"a,label\r1,0\r2,1\r")(tmp_path))
    assert error.reason == "malformed-csv"


@pytest.mark.parametrize(
    ("arrays", "limits", "reason", "detail"),
    [
        ({"X": np.ones(5), "y": np.arange(5) % 2}, IngestLimits(), "shape-mismatch", "X has 1"),
        (
            {"X": np.ones((5, 2, 2, 2, 2)), "y": np.arange(5) % 2},
            IngestLimits(),
            "shape-mismatch",
            "X has 5",
        ),
        ({"X": np.ones((4, 2)), "y": np.ones((4, 1))}, IngestLimits(), "shape-mismatch", "y has 2"),
        ({"X": np.ones((0, 2)), "y": np.ones(0)}, IngestLimits(), "empty-dataset", "no rows"),
        ({"X": np.ones((3, 0)), "y": np.arange(3)}, IngestLimits(), "empty-dataset", "no features"),
        (
            {"X": np.ones((4, 2)), "y": np.arange(4) % 2},
            IngestLimits(max_rows=3),
            "too-many-rows",
            "4 rows",
        ),
        (
            {"X": np.ones((4, 2, 3, 3)), "y": np.arange(4) % 2},
            IngestLimits(max_features=17),
            "too-many-columns",
            "18 features",
        ),
        (
            {"X": np.ones((4, 2), np.complex64), "y": np.arange(4) % 2},
            IngestLimits(),
            "non-numeric",
            "X.npy",
        ),
        (
            {"X": np.ones((4, 2)), "y": np.array(["a", "b", "a", "b"])},
            IngestLimits(),
            "non-numeric",
            "y.npy",
        ),
    ],
    ids=[
        "X-1d",
        "X-5d",
        "y-2d",
        "no-rows",
        "no-features",
        "rows",
        "features",
        "complex",
        "str",
    ],
)
def test_npz_structure(
    arrays: dict[str, np.ndarray],
    limits: IngestLimits,
    reason: str,
    detail: str,
    tmp_path: Path,
) -> None:
    error = _reject(_npz(arrays)(tmp_path), fmt="npz", limits=limits)
    assert error.reason == reason
    assert detail in error.detail


def test_npz_non_finite_features_name_the_index(tmp_path: Path) -> None:
    X = np.zeros((4, 2, 3))
    X[2, 1, 0] = np.inf
    error = _reject(_npz({"X": X, "y": np.arange(4) % 2})(tmp_path), fmt="npz")
    assert error.reason == "non-finite"
    assert "(2, 1, 0)" in error.detail


def test_npz_features_beyond_float32(tmp_path: Path) -> None:
    X = np.zeros((3, 2))
    X[1, 1] = 1.337e39
    error = _reject(_npz({"X": X, "y": np.arange(3) % 2})(tmp_path), fmt="npz")
    assert error.reason == "non-finite"
    assert "(1, 1)" in error.detail and "1337" not in error.detail


def test_npz_non_finite_label_names_the_index(tmp_path: Path) -> None:
    path = _npz({"X": np.ones((3, 2)), "y": np.array([0.0, np.nan, 1.0])})(tmp_path)
    error = _reject(path, fmt="npz")
    assert (error.reason, "index 1" in error.detail) == ("non-finite", True)


@pytest.mark.parametrize(
    ("labels", "task", "expected"),
    [
        ([0, 1, 13371337], "classification", "line 4"),
        ([0, 1, 13371337], None, None),  # inferred as regression: not class indices
        ([2, 2, 2], "classification", "same class"),
        ([0, 0, 0], None, None),  # one value: inferred as regression, which is fine
    ],
)
def test_classification_labels(labels: list[int], task: str | None, expected: str | None, tmp_path: Path) -> None:
    rows = "".join(f"{i},{label}\n" for i, label in enumerate(labels))
    path = _text(f"a,label\n{rows}")(tmp_path)
    if expected is None:
        parsed = parse_dataset(path, fmt="csv", label_column="label", task=task, limits=IngestLimits())
        assert parsed.task == "regression"
        return
    error = _reject(path, task=task)
    assert error.reason == "bad-labels"
    assert expected in error.detail
    assert SECRET_NUMBER not in error.detail


def test_npz_non_integral_label_names_the_index(tmp_path: Path) -> None:
    y = np.array([0.0, 1.0, 0.0, 13371337.5])
    path = _npz({"X": np.ones((4, 2)), "y": y})(tmp_path)
    error = _reject(path, fmt="npz", task="classification")
    assert error.reason == "bad-labels"
    assert "index 3" in error.detail and SECRET_NUMBER not in error.detail


def test_max_classes_limit(tmp_path: Path) -> None:
    path = _text("a,label\n1,0\n2,5\n")(tmp_path)
    error = _reject(path, task="classification", limits=IngestLimits(max_classes=5))
    assert error.reason == "bad-labels"
    assert "line 3" in error.detail and "below 5" in error.detail


def test_regression_needs_two_rows(tmp_path: Path) -> None:
    error = _reject(_text("a,label\n1,0.5\n")(tmp_path), task="regression")
    assert error.reason == "bad-labels"
    assert "at least 2 rows" in error.detail


def test_format_and_task_are_checked_before_the_file_is_opened(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist.csv"
    assert _reject(missing, fmt="xlsx").reason == "unknown-format"
    assert _reject(missing, task="ranking").reason == "unknown-task"


def test_error_is_a_value_error_and_survives_pickling() -> None:
    error = DatasetValidationError("ragged-row", "line 3 has 2 fields")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.reason, copy.detail) == ("ragged-row", "line 3 has 2 fields")


def test_error_refuses_an_unknown_reason() -> None:
    with pytest.raises(ValueError, match="unknown dataset validation reason"):
        DatasetValidationError("oops", "detail")  # type: ignore[arg-type]


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        IngestLimits(max_rows=0)
