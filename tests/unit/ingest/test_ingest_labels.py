"""Labels to class indices (issue 14): text and integer labels, matched by name, never shifted.

Properties: whatever the labels, ``classes[y[i]]`` is row i's label (as text, or as the number's
name), with a declared list or without one.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.ingest import DatasetValidationError, IngestLimits, ParsedDataset, parse_class_list, parse_dataset

LIMITS = IngestLimits()


def _parse(
    labels: list[str], *, task: str | None = None, classes: tuple[str, ...] | None = None, limits: IngestLimits = LIMITS
) -> ParsedDataset:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "data.csv"
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["x", "label"])
            writer.writerows([i, label] for i, label in enumerate(labels))
        return parse_dataset(path, fmt="csv", label_column="label", task=task, limits=limits, classes=classes)


def _refused(labels: list[str], **options: object) -> DatasetValidationError:
    with pytest.raises(DatasetValidationError) as caught:
        _parse(labels, **options)  # type: ignore[arg-type]
    return caught.value


words = st.text(alphabet="abcdeXYZ _-é", min_size=1, max_size=8).map(str.strip).filter(bool)


@settings(database=None, max_examples=60, deadline=None)
@given(
    labels=st.lists(words, min_size=2, max_size=30).filter(
        lambda ls: len(set(ls)) >= 2 and not all(_is_number(w) for w in ls)
    )
)
def test_text_labels_map_to_the_sorted_distinct_names(labels: list[str]) -> None:
    parsed = _parse(labels)
    assert parsed.task == "classification" and parsed.classes is not None
    assert parsed.classes.names == tuple(sorted(set(labels))) and not parsed.classes.declared
    assert [parsed.classes.names[i] for i in parsed.y] == labels
    assert parsed.y.dtype == np.int64 and parsed.n_classes == len(set(labels))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@settings(database=None, max_examples=60, deadline=None)
@given(data=st.data(), names=st.lists(words, min_size=2, max_size=6, unique=True))
def test_labels_match_a_declared_list_by_name_in_any_order(data: st.DataObject, names: list[str]) -> None:
    names = [name for name in names if "," not in name]
    if len(names) < 2 or any(_is_number(name) for name in names):
        return
    labels = data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=30).filter(lambda ls: len(set(ls)) >= 2))
    declared = parse_class_list(",".join(names), max_classes=LIMITS.max_classes)
    assert declared is not None
    parsed = _parse(labels, classes=declared)
    assert parsed.classes is not None and parsed.classes.declared and parsed.classes.names == declared
    assert [declared[i] for i in parsed.y] == labels


@settings(database=None, max_examples=60, deadline=None)
@given(
    offset=st.integers(-5, 40).filter(bool),
    codes=st.lists(st.integers(0, 6), min_size=2, max_size=30).filter(lambda cs: len(set(cs)) >= 2),
)
def test_whole_numbers_not_starting_at_zero_are_names_once_the_task_is_stated(offset: int, codes: list[int]) -> None:
    labels = [code + offset for code in codes]
    if min(labels) == 0:
        return  # 0-based labels are indices, covered below
    assert _refused([str(v) for v in labels]).reason == "ambiguous-task"
    parsed = _parse([str(v) for v in labels], task="classification")
    assert parsed.classes is not None
    assert parsed.classes.names == tuple(str(v) for v in sorted(set(labels)))
    assert [parsed.classes.names[i] for i in parsed.y] == [str(v) for v in labels]
    declared = tuple(str(v) for v in sorted(set(labels), reverse=True))
    by_name = _parse([f"{v}.0" for v in labels], classes=declared)  # 3.0 is the name "3": by value
    assert [declared[i] for i in by_name.y] == [str(v) for v in labels]


def test_zero_based_whole_numbers_stay_class_indices() -> None:
    parsed = _parse(["0", "3", "1", "3"])
    assert parsed.classes is not None and parsed.classes.names == ("0", "1", "2", "3")
    np.testing.assert_array_equal(parsed.y, [0, 3, 1, 3])


def test_indices_into_a_declared_list_of_words_still_work() -> None:
    parsed = _parse(["0", "benign", "1", "malignant"], classes=("benign", "malignant"))
    np.testing.assert_array_equal(parsed.y, [0, 0, 1, 1])


def test_a_numeric_declared_list_matches_by_value_never_as_indices() -> None:
    error = _refused(["0", "1", "2"], classes=("1", "2"))
    assert error.reason == "label-not-in-classes"
    assert "line 2" in error.detail and "never shifted" in error.detail


@pytest.mark.parametrize(
    ("labels", "options", "reason", "detail"),
    [
        (["yes", "no", "SECRET"], {"task": "regression"}, "bad-labels", "line 2"),
        (["yes", "", "no"], {}, "bad-labels", "line 3"),
        (["yes", "y" * 101, "no"], {}, "bad-labels", "100 characters"),
        (["yes", "yes"], {}, "bad-labels", "same class"),
        (["a", "b", "c"], {"limits": IngestLimits(max_classes=2)}, "bad-labels", "at most 2 classes"),
        (["yes", "no", "maybe"], {"classes": ("yes", "no")}, "label-not-in-classes", "line 4"),
        (["1", "9007199254740993"], {"task": "classification"}, "bad-labels", "2^53"),
        (["-1", "1", "0.5"], {"task": "classification"}, "bad-labels", "whole numbers or text"),
    ],
)
def test_label_refusals_name_the_row_not_the_value(
    labels: list[str], options: dict[str, object], reason: str, detail: str
) -> None:
    error = _refused(labels, **options)
    assert error.reason == reason and detail in error.detail, error.detail
    assert "SECRET" not in error.detail and "maybe" not in error.detail


def test_negative_whole_numbers_are_class_names() -> None:
    parsed = _parse(["-1", "1", "1", "-1"], task="classification")
    assert parsed.classes is not None and parsed.classes.names == ("-1", "1")
    np.testing.assert_array_equal(parsed.y, [0, 1, 1, 0])


@pytest.mark.parametrize("raw", ["1,1.0", "2, 2e0"])
def test_declared_names_that_are_the_same_number_are_refused(raw: str) -> None:
    with pytest.raises(DatasetValidationError) as caught:
        parse_class_list(raw, max_classes=10)
    assert caught.value.reason == "bad-class-list" and "different numbers" in caught.value.detail
