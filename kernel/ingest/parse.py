"""The entry point: one call from an uploaded file to a validated, prepared dataset."""

from __future__ import annotations

from pathlib import Path

# Imported for their side effect: each registers its reader.
from kernel.ingest import csv_reader, npz_reader  # noqa: F401
from kernel.ingest.classes import task_for_class_list
from kernel.ingest.dataset import ParsedDataset
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.labels import check_task, resolve_labels
from kernel.ingest.limits import IngestLimits
from kernel.ingest.numeric import first_non_finite
from kernel.ingest.preparation import Preparation
from kernel.ingest.registry import RawDataset, get_reader, supported_formats
from kernel.ingest.scaling import apply_scaling

SUPPORTED_FORMATS: tuple[str, ...] = supported_formats()


def parse_dataset(
    path: Path,
    *,
    fmt: str,
    label_column: str | None,
    task: str | None,
    limits: IngestLimits,
    classes: tuple[str, ...] | None = None,
    preparation: Preparation | None = None,
    unit_column: str | None = None,
) -> ParsedDataset:
    """Read, validate and prepare an upload, or raise DatasetValidationError naming what is wrong
    and where.

    Format and task are checked before the file is opened, so a bad request costs no I/O. With a
    declared class list (``classes``) the task is classification and labels are matched to it by
    name. The declared ``preparation`` is applied: dropped columns are never read, one-hot columns
    are expanded, and the features come back scaled as declared, ready to train on. With
    ``unit_column`` (the privacy unit column) each row's unit comes back as an index in ``units``.
    """
    reader = get_reader(fmt)
    requested = check_task(task_for_class_list(task, classes))
    if preparation is not None and preparation.labels_are_indices and classes is None:
        raise DatasetValidationError(
            "bad-preparation", 'preparation: "labels": "indices" needs a declared class list (classes=)'
        )
    raw = reader(path, label_column=label_column, limits=limits, preparation=preparation, unit_column=unit_column)
    labels = resolve_labels(
        raw.labels,
        task=requested,
        classes=classes,
        max_classes=limits.max_classes,
        rows=raw.rows,
        labels_are_indices=preparation is not None and preparation.labels_are_indices,
    )
    _scale(raw)
    return ParsedDataset(
        X=raw.X,
        y=labels.y,
        task=labels.task,
        n_classes=labels.n_classes,
        feature_shape=tuple(int(size) for size in raw.X.shape[1:]),
        feature_names=raw.feature_names,
        classes=labels.classes,
        units=raw.units,
    )


def _scale(raw: RawDataset) -> None:
    """Apply the declared scaling; a standardised value beyond float32 is refused, naming the cell."""
    if not raw.scaling:
        return
    apply_scaling(raw.X, raw.scaling)
    bad = first_non_finite(raw.X)
    if bad is None:
        return
    row, *cell = bad
    column = f"column {raw.feature_names[cell[0]]!r}" if raw.feature_names is not None else f"feature {tuple(cell)}"
    raise DatasetValidationError(
        "non-finite",
        f"{raw.rows.describe(row)}, {column}: the scaled value is too large for float32; check the "
        "center and scale declared for it",
    )
