"""The public class list of a classification dataset: declared by the owner, or taken from labels.

Why it matters (docs/privacy-model.md §2): whatever a non-owner can see about a dataset must be a fact the
owner chose to make public. Deriving the number of classes as ``max(label) + 1`` makes it an exact
function of the rows: two datasets that differ in one row can differ in it. So the owner may
declare the list at upload (``classes=benign,malignant``) and it is then independent of the rows.
When they do not, the labels found become the list, and the upload response says that this list
is now public.

How labels become class indices:

- with a declared list, each label is matched by **name** (``malignant`` → its position; the
  number ``2`` → the position of the name ``2``). Labels are never shifted: with ``classes=1,2``
  the label 1 is class 0. Only when no declared name is a number may a label also be an index
  into the list (0 to K − 1), as datasets labelled 0..K−1 always were;
- without one, whole-number labels starting at 0 are indices (label i is class i); other labels
  (text, or whole numbers like 1 and 2) are names, and the sorted distinct values become the list.
"""

from __future__ import annotations

import math
import unicodedata

import numpy as np

from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.numeric import first_true
from kernel.ingest.registry import RawLabels, RowPositions

MAX_CLASS_NAME_CHARS = 100
LARGEST_NUMERIC_NAME = 2.0**53
"""Whole-number labels used as names must be exact in float64 (and short enough to be a name)."""


def _as_number(name: str) -> float | None:
    """The name's value when it is a finite number ("2", "2.0", " 2"), else None."""
    try:
        value = float(name)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _name_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name) > MAX_CLASS_NAME_CHARS:
        return f"is longer than {MAX_CLASS_NAME_CHARS} characters, the longest a class name may be"
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        return "contains control characters, which a class name may not"
    return None


def parse_class_list(raw: str | None, *, max_classes: int) -> tuple[str, ...] | None:
    """``a,b,c`` → ("a", "b", "c"); None when the owner declared nothing.

    Names are trimmed, non-empty, unique, printable and at most 100 characters; there must be 2 to
    ``max_classes`` of them. A name may not contain a comma (it separates names). Names that are
    numbers must differ as numbers ("1" and "1.0" would match the same labels).
    """
    if raw is None:
        return None
    names = tuple(part.strip() for part in raw.split(","))
    values = [value for value in map(_as_number, names) if value is not None]
    problems = (
        (not 2 <= len(names) <= max_classes, f"a class list needs 2 to {max_classes} names, got {len(names)}"),
        (any(not name for name in names), "class names must not be empty"),
        (
            any(len(name) > MAX_CLASS_NAME_CHARS for name in names),
            f"class names must be at most {MAX_CLASS_NAME_CHARS} characters",
        ),
        (
            any(unicodedata.category(ch).startswith("C") for name in names for ch in name),
            "class names must not contain control characters",
        ),
        (len(set(names)) != len(names), "class names must be unique"),
        (len(set(values)) != len(values), "class names that are numbers must be different numbers"),
    )
    for failed, rule in problems:
        if failed:
            raise DatasetValidationError("bad-class-list", rule)
    return names


def task_for_class_list(task: str | None, classes: tuple[str, ...] | None) -> str | None:
    """A declared class list means classification; asking for regression with one is an error."""
    if classes is None:
        return task
    if task not in (None, "classification"):
        raise DatasetValidationError("bad-class-list", "a class list needs task=classification")
    return "classification"


# ------------------------------------------------------------------ a declared list


def map_to_declared(
    labels: RawLabels, names: tuple[str, ...], *, rows: RowPositions, by_index: bool = False
) -> np.ndarray:
    """Each label's index in the declared list (int64), matched by name; see the module docstring.
    ``by_index``: the owner declared the labels to be indices (``"labels": "indices"``).

    The detail of a refusal names the row, never the label's value (values are the private data).
    """
    by_value = {value: i for i, name in enumerate(names) if (value := _as_number(name)) is not None}
    if by_index:
        numbers = labels.numbers  # a text label is NaN, which no index matches
        y = _numbers_to_declared(numbers, by_value={}, n_classes=len(names))
    elif labels.first_text() is None:
        y = _numbers_to_declared(labels.numbers, by_value=by_value, n_classes=len(names))
    else:
        y = _texts_to_declared(labels, names=names, by_value=by_value)
    row = first_true(y < 0)
    if row is not None:
        where = rows.describe(row)
        detail = (
            (
                f"the label at {where} is not an index into the declared class list of {len(names)} "
                f'classes: the labels were declared as indices ("labels": "indices"), so they must be '
                f"0 to {len(names) - 1}"
            )
            if by_index
            else _not_in_classes(where, names, by_value)
        )
        raise DatasetValidationError("label-not-in-classes", detail)
    return y


def _numbers_to_declared(numbers: np.ndarray, *, by_value: dict[float, int], n_classes: int) -> np.ndarray:
    y = np.full(numbers.shape, -1, dtype=np.int64)
    if by_value:  # names that are numbers: labels match them by value, never as indices
        keys = np.array(sorted(by_value), dtype=np.float64)
        targets = np.array([by_value[key] for key in keys.tolist()], dtype=np.int64)
        at = np.minimum(np.searchsorted(keys, numbers), keys.size - 1)
        hit = keys[at] == numbers
        y[hit] = targets[at[hit]]
        return y
    index = (numbers == np.floor(numbers)) & (numbers >= 0) & (numbers < n_classes)
    y[index] = numbers[index].astype(np.int64)
    return y


def _texts_to_declared(labels: RawLabels, *, names: tuple[str, ...], by_value: dict[float, int]) -> np.ndarray:
    texts = labels.texts
    if texts is None or texts.codes is None:
        raise DatasetValidationError(
            "label-not-in-classes",
            f"the labels take more distinct values than the {len(names)} declared classes",
        )
    by_text = {name: i for i, name in enumerate(names)}

    def target(text: str) -> int:
        if text in by_text:
            return by_text[text]
        value = _as_number(text)
        if value is None:
            return -1
        if by_value:
            return by_value.get(value, -1)
        return int(value) if value.is_integer() and 0 <= value < len(names) else -1

    table = np.array([target(text) for text in texts.distinct], dtype=np.int64)
    targets: np.ndarray = table[texts.codes]
    return targets


def _not_in_classes(where: str, names: tuple[str, ...], by_value: dict[float, int]) -> str:
    start = f"the label at {where} is not in the declared class list of {len(names)} classes"
    if by_value:
        return (
            f"{start}: labels are matched by name, and a label that is a number must equal one of "
            "the names that are numbers (labels are never shifted; if the labels are indices into "
            'the list, declare preparation={"labels": "indices"})'
        )
    return (
        f"{start}: a label must be one of its names, or an index into it (labels must be 0 to "
        f"{len(names) - 1}). Labels are matched by name, never shifted: to keep labels such as 1 "
        "and 2 as they are, declare them as the names (classes=1,2)"
    )


# ------------------------------------------------------------------ a list taken from the labels


def _too_many(max_classes: int) -> DatasetValidationError:
    return DatasetValidationError(
        "bad-labels",
        f"the labels take more than {max_classes} distinct values: a dataset may have at most {max_classes} classes",
    )


def _check_two_classes(n_distinct: int, n_rows: int) -> None:
    if n_distinct < 2:
        raise DatasetValidationError(
            "bad-labels", f"all {n_rows} labels are the same class; classification needs at least 2"
        )


def classes_from_texts(
    labels: RawLabels, *, max_classes: int, rows: RowPositions
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Text labels (at least one is not a number): the sorted distinct texts become the list."""
    texts = labels.texts
    if texts is None or texts.codes is None or len(texts.distinct) > max_classes:
        raise _too_many(max_classes)
    for code, text in enumerate(texts.distinct):
        problem = _name_problem(text)
        if problem is not None:
            row = int(np.argmax(texts.codes == code))
            raise DatasetValidationError("bad-labels", f"the label at {rows.describe(row)} {problem}")
    order = sorted(range(len(texts.distinct)), key=texts.distinct.__getitem__)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    _check_two_classes(len(order), texts.codes.size)
    return rank[texts.codes], tuple(texts.distinct[code] for code in order)


def classes_from_numbers(
    numbers: np.ndarray, *, max_classes: int, rows: RowPositions
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Whole-number labels that are not 0-based indices (1 and 2; -1 and 1): the sorted distinct
    values become the list, and each label is matched by name."""
    values, inverse = np.unique(numbers, return_inverse=True)
    if values.size > max_classes:
        raise _too_many(max_classes)
    row = first_true(np.abs(numbers) >= LARGEST_NUMERIC_NAME)
    if row is not None:
        raise DatasetValidationError(
            "bad-labels",
            f"the label at {rows.describe(row)}: class labels that are numbers must be below 2^53 in magnitude",
        )
    _check_two_classes(values.size, numbers.size)
    return inverse.astype(np.int64).reshape(-1), tuple(str(int(value)) for value in values.tolist())


def classes_from_indices(
    numbers: np.ndarray, *, max_classes: int, rows: RowPositions
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Whole-number labels starting at 0: label i is class i, and the list is 0 .. max."""
    row = first_true(numbers >= max_classes)
    if row is not None:
        raise DatasetValidationError(
            "bad-labels", f"the label at {rows.describe(row)}: classification labels must be below {max_classes}"
        )
    y = numbers.astype(np.int64)
    _check_two_classes(1 if y.min() == y.max() else 2, y.size)
    return y, tuple(str(i) for i in range(int(y.max()) + 1))
