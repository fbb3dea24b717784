"""Turns validated label values into a task, its label array and the number of classes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.ingest.dataset import TASKS, Task
from app.ingest.errors import DatasetValidationError
from app.ingest.numeric import as_float32, first_non_finite, first_true
from app.ingest.registry import RowPositions


@dataclass(frozen=True, eq=False)
class Labels:
    """The task a dataset is trained for and its labels in the dtype that task needs."""

    y: np.ndarray = field(repr=False)
    task: Task
    n_classes: int | None


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


def infer_task(labels: np.ndarray, *, max_classes: int) -> Task:
    """Classification iff the labels look like class indices: whole numbers 0..K-1, K >= 2.

    Requiring the smallest label to be 0 keeps integer-valued targets (counts, scores, prices in
    whole units; sklearn's diabetes target, 25..346) from being taken for hundreds of classes.
    """
    if labels.size == 0 or not bool(np.all(labels == np.floor(labels))):
        return "regression"
    smallest, largest = float(labels.min()), float(labels.max())
    if smallest == 0 and 0 < largest < max_classes:
        return "classification"
    return "regression"


def resolve_labels(
    labels: np.ndarray, *, task: Task | None, max_classes: int, rows: RowPositions
) -> Labels:
    """Apply the requested (or, when None, inferred) task's rules to finite float64 labels."""
    resolved = task or infer_task(labels, max_classes=max_classes)
    if resolved == "classification":
        return _classification(labels, max_classes=max_classes, rows=rows)
    return _regression(labels, rows=rows)


def _classification(labels: np.ndarray, *, max_classes: int, rows: RowPositions) -> Labels:
    checks = (
        (labels != np.floor(labels), "classification labels must be whole numbers"),
        (labels < 0, "classification labels must not be negative"),
        (labels >= max_classes, f"classification labels must be below {max_classes}"),
    )
    for mask, rule in checks:
        row = first_true(mask)
        if row is not None:
            raise DatasetValidationError("bad-labels", f"the label at {rows.describe(row)}: {rule}")
    y = labels.astype(np.int64)
    if y.min() == y.max():
        raise DatasetValidationError(
            "bad-labels",
            f"all {y.size} labels are the same class; classification needs at least 2",
        )
    return Labels(y=y, task="classification", n_classes=int(y.max()) + 1)


def _regression(labels: np.ndarray, *, rows: RowPositions) -> Labels:
    if labels.size < 2:
        raise DatasetValidationError(
            "bad-labels", f"regression needs at least 2 rows; the dataset has {labels.size}"
        )
    y = as_float32(labels)
    bad = first_non_finite(y)
    if bad is not None:
        raise DatasetValidationError(
            "non-finite", f"the label at {rows.describe(bad[0])} is too large for float32"
        )
    return Labels(y=y, task="regression", n_classes=None)
