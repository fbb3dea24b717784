"""Turns the label column into a task, its label array and (for classification) the class list.

The task is the owner's to state (``task=``, or ``classes=`` which means classification). It is
inferred only when the labels leave no doubt: text labels are classes, fractional numbers are
targets, whole numbers 0..K-1 are class indices. Whole numbers that do not start at 0 (1 and 2;
25 to 346) could be either, and such an upload is refused until the owner says which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kernel.ingest.classes import classes_from_indices, classes_from_numbers, classes_from_texts, map_to_declared
from kernel.ingest.dataset import TASKS, ClassList, Task
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.numeric import as_float32, first_non_finite, first_true
from kernel.ingest.registry import RawLabels, RowPositions


@dataclass(frozen=True, eq=False)
class Labels:
    """The task a dataset is trained for and its labels in the dtype that task needs."""

    y: np.ndarray = field(repr=False)
    task: Task
    classes: ClassList | None

    @property
    def n_classes(self) -> int | None:
        return len(self.classes.names) if self.classes is not None else None


def check_task(task: str | None) -> Task | None:
    """Validate the requested task up front, before a large file is read for nothing."""
    if task is None:
        return None
    for known in TASKS:  # a loop rather than `in`, so that the result is typed as a Task
        if task == known:
            return known
    raise DatasetValidationError(
        "unknown-task",
        f"task must be one of {', '.join(TASKS)}, or omitted to infer it from the labels",
    )


AMBIGUOUS_TASK = (
    "the labels are whole numbers that do not start at 0, so they could be class labels (like 1 and "
    "2) or numeric targets (like counts or scores). Say which at upload: task=classification (the "
    "distinct values become the class list, each label matched by its value; or declare the list "
    "with classes=, e.g. classes=1,2) or task=regression"
)


def infer_task(labels: RawLabels, *, max_classes: int) -> Task:
    """The task when the labels leave no doubt; refuses ``ambiguous-task`` otherwise.

    Requiring class indices to start at 0 keeps integer-valued targets (counts, scores, prices in
    whole units; sklearn's diabetes target, 25..346) from being taken for hundreds of classes.
    """
    if labels.first_text() is not None:
        return "classification"
    numbers = labels.numbers
    if not bool(np.all(numbers == np.floor(numbers))):
        return "regression"
    if float(numbers.min()) == 0:
        return "classification" if 0 < float(numbers.max()) < max_classes else "regression"
    if np.unique(numbers).size > max_classes:  # too many values to be classes
        return "regression"
    raise DatasetValidationError("ambiguous-task", AMBIGUOUS_TASK)


def resolve_labels(
    labels: RawLabels,
    *,
    task: Task | None,
    classes: tuple[str, ...] | None,
    max_classes: int,
    rows: RowPositions,
    labels_are_indices: bool = False,
) -> Labels:
    """Apply the declared list, or the requested (or, when None, inferred) task's rules."""
    if classes is not None:
        y = map_to_declared(labels, classes, rows=rows, by_index=labels_are_indices)
        if y.min() == y.max():
            raise DatasetValidationError(
                "bad-labels", f"all {y.size} labels are the same class; classification needs at least 2"
            )
        return Labels(y=y, task="classification", classes=ClassList(names=classes, declared=True))
    resolved = task or infer_task(labels, max_classes=max_classes)
    return _BY_TASK[resolved](labels, max_classes=max_classes, rows=rows)


def _classification(labels: RawLabels, *, max_classes: int, rows: RowPositions) -> Labels:
    if labels.first_text() is not None:
        y, names = classes_from_texts(labels, max_classes=max_classes, rows=rows)
    else:
        numbers = labels.numbers
        row = first_true(numbers != np.floor(numbers))
        if row is not None:
            raise DatasetValidationError(
                "bad-labels",
                f"the label at {rows.describe(row)}: classification labels must be whole numbers or text",
            )
        from_labels = classes_from_indices if float(numbers.min()) == 0 else classes_from_numbers
        y, names = from_labels(numbers, max_classes=max_classes, rows=rows)
    return Labels(y=y, task="classification", classes=ClassList(names=names, declared=False))


def _regression(labels: RawLabels, *, max_classes: int, rows: RowPositions) -> Labels:
    del max_classes  # a regression has no classes
    text = labels.first_text()
    if text is not None:
        raise DatasetValidationError(
            "bad-labels",
            f"the label at {rows.describe(text)} is not a number; task=regression needs numeric labels",
        )
    if labels.numbers.size < 2:
        raise DatasetValidationError(
            "bad-labels", f"regression needs at least 2 rows; the dataset has {labels.numbers.size}"
        )
    y = as_float32(labels.numbers)
    bad = first_non_finite(y)
    if bad is not None:
        raise DatasetValidationError("non-finite", f"the label at {rows.describe(bad[0])} is too large for float32")
    return Labels(y=y, task="regression", classes=None)


_BY_TASK: dict[Task, Callable[..., Labels]] = {
    "classification": _classification,
    "regression": _regression,
}
