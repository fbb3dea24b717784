"""The entry point: one call from an uploaded file to a validated dataset."""

from __future__ import annotations

from pathlib import Path

# Imported for their side effect: each registers its reader.
from app.ingest import csv_reader, npz_reader  # noqa: F401
from app.ingest.classes import check_labels_in_classes, task_for_class_list
from app.ingest.dataset import ParsedDataset
from app.ingest.labels import check_task, resolve_labels
from app.ingest.limits import IngestLimits
from app.ingest.registry import get_reader, supported_formats

SUPPORTED_FORMATS: tuple[str, ...] = supported_formats()


def parse_dataset(
    path: Path, *, fmt: str, label_column: str | None, task: str | None, limits: IngestLimits,
    classes: tuple[str, ...] | None = None,
) -> ParsedDataset:
    """Read and validate an upload, or raise DatasetValidationError naming what is wrong and where.

    Format and task are checked before the file is opened, so a bad request costs no I/O. With a
    declared class list (``classes``) the task is classification and every label must index it.
    """
    reader = get_reader(fmt)
    requested = check_task(task_for_class_list(task, classes))
    raw = reader(path, label_column=label_column, limits=limits)
    labels = resolve_labels(
        raw.labels, task=requested, max_classes=limits.max_classes, rows=raw.rows
    )
    if classes is not None:
        check_labels_in_classes(labels.y, classes, rows=raw.rows)
    return ParsedDataset(
        X=raw.X,
        y=labels.y,
        task=labels.task,
        n_classes=labels.n_classes,
        feature_shape=tuple(int(size) for size in raw.X.shape[1:]),
        feature_names=raw.feature_names,
    )
