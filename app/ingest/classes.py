"""The public class list of a classification dataset: declared by the owner, or taken from labels.

Why it matters (docs/privacy-model.md §2): whatever a non-owner can see about a dataset must be a fact the
owner chose to make public. Deriving the number of classes as ``max(label) + 1`` makes it an exact
function of the rows: two datasets that differ in one row can differ in it. So the owner may
declare the list at upload (``classes=benign,malignant``: label ``i`` is the ``i``-th name) and it
is then independent of the rows. When they do not, the labels found become the list, and the
upload response says that this list is now public.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from app.ingest.errors import DatasetValidationError
from app.ingest.numeric import first_true
from app.ingest.registry import RowPositions

MAX_CLASS_NAME_CHARS = 100


def parse_class_list(raw: str | None, *, max_classes: int) -> tuple[str, ...] | None:
    """``a,b,c`` → ("a", "b", "c"); None when the owner declared nothing.

    Names are trimmed, non-empty, unique, printable and at most 100 characters; there must be 2 to
    ``max_classes`` of them. A name may not contain a comma (it separates names).
    """
    if raw is None:
        return None
    names = tuple(part.strip() for part in raw.split(","))
    problems = (
        (not 2 <= len(names) <= max_classes, f"a class list needs 2 to {max_classes} names, got {len(names)}"),
        (any(not name for name in names), "class names must not be empty"),
        (any(len(name) > MAX_CLASS_NAME_CHARS for name in names),
         f"class names must be at most {MAX_CLASS_NAME_CHARS} characters"),
        (any(unicodedata.category(ch).startswith("C") for name in names for ch in name),
         "class names must not contain control characters"),
        (len(set(names)) != len(names), "class names must be unique"),
    )
    for failed, rule in problems:
        if failed:
            raise DatasetValidationError("bad-class-list", rule)
    return names


def check_labels_in_classes(y: np.ndarray, classes: tuple[str, ...], *, rows: RowPositions) -> None:
    """Every label must index the declared list (0 .. len(classes) - 1).

    The detail names the row, never the label's value (values are the private data).
    """
    row = first_true(y >= len(classes))
    if row is not None:
        raise DatasetValidationError(
            "label-not-in-classes",
            f"the label at {rows.describe(row)} is not an index into the declared class list of "
            f"{len(classes)} classes (labels must be 0 to {len(classes) - 1})",
        )


def task_for_class_list(task: str | None, classes: tuple[str, ...] | None) -> str | None:
    """A declared class list means classification; asking for regression with one is an error."""
    if classes is None:
        return task
    if task not in (None, "classification"):
        raise DatasetValidationError("bad-class-list", "a class list needs task=classification")
    return "classification"
