"""A job's rows as the model sees them, placed for its device (dp/data/rows.py), from the inputs
the kernel reads for it (kernel/job_run.py: DataSource): labels mapped to the dataset's
public class list (by name, exactly as at upload) and the owner's declared preparation applied
(columns dropped, one-hot encoded, scaled and clipped to declared bounds: a public map of each
row, no privacy cost). Rows, labels and units are private: they stay in memory, never in a log."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dp.data.images import ImageRows
from dp.data.rows import Rows, TensorRows, place_image_rows
from dp.data.tokens import TokenRows, language_model_targets
from kernel.db.orm import Dataset
from kernel.job_run import DataSource
from worker.context import WorkerContext

__all__ = ["JobData", "load_data_and_units"]


@dataclass(frozen=True)
class JobData:
    rows: Rows
    y: torch.Tensor
    units: np.ndarray | None
    """Each row's privacy unit (int64 codes); None when the unit is a row."""
    class_names: tuple[str, ...] | None
    """The public class list output i stands for (None for regression)."""


def load_data_and_units(ctx: WorkerContext, dataset: Dataset, device: torch.device) -> JobData:
    """The dataset's rows, labels and privacy units, placed for ``device``."""
    source = ctx.kernel.data(dataset)
    if dataset.modality == "image":
        rows, y = _images(ctx, dataset, source, device)
        return JobData(rows=rows, y=y, units=None, class_names=source.class_names)
    if dataset.modality == "text":
        rows, y, units = _tokens(ctx, dataset, source, device)
        return JobData(rows=rows, y=y, units=units, class_names=source.class_names)
    parsed = source.table
    assert parsed is not None
    rows = TensorRows(torch.from_numpy(parsed.X), device=device)
    return JobData(rows=rows, y=torch.from_numpy(parsed.y), units=parsed.units, class_names=source.class_names)


def _images(
    ctx: WorkerContext, dataset: Dataset, source: DataSource, device: torch.device
) -> tuple[Rows, torch.Tensor]:
    """An image dataset: its decoded uint8 array, on the GPU when it fits there, else
    memory-mapped, normalised to x / 255 in (C, H, W) batch by batch (never copied whole as
    float: datasets larger than memory train); its labels from the upload, mapped as at upload."""
    assert source.array is not None and source.labels is not None
    channels, height, width = dataset.feature_shape
    rows = ImageRows(source.array, shape=(channels, height, width))
    y = source.labels
    if y.shape[0] != rows.n_rows:
        raise ValueError(f"dataset {dataset.id}: {rows.n_rows} images but {y.shape[0]} labels")
    placed = place_image_rows(rows, device, max_device_fraction=ctx.settings.data_on_device_max_fraction)
    return placed, torch.from_numpy(y)


def _tokens(
    ctx: WorkerContext, dataset: Dataset, source: DataSource, device: torch.device
) -> tuple[Rows, torch.Tensor, np.ndarray | None]:
    """A text dataset: its stored token ids (int64 batches; on the GPU when they fit, else
    memory-mapped). y: for classification the labels re-read from the upload and mapped as at
    upload; for language modelling the ids themselves with every pad position -100. Units: each
    record's privacy unit, re-read in the same pass (None without a privacy unit column)."""
    assert source.array is not None and dataset.pad_id is not None
    rows = TokenRows.placed(
        source.array,
        max_length=int(dataset.feature_shape[0]),
        device=device,
        max_device_fraction=ctx.settings.data_on_device_max_fraction,
    )
    classification = dataset.task == "classification"
    scanned = source.scanned
    if scanned is None:  # a language model without privacy units
        return rows, language_model_targets(rows, pad_id=dataset.pad_id), None
    mismatch = scanned.n_rows != rows.n_rows or scanned.n_units != dataset.n_units
    if mismatch or (classification and scanned.y is None):
        raise ValueError(f"dataset {dataset.id}: {rows.n_rows} token rows but the upload's records do not match")
    if scanned.y is None:  # a language model per unit: its targets are its own ids
        return rows, language_model_targets(rows, pad_id=dataset.pad_id), scanned.units
    return rows, torch.from_numpy(scanned.y), scanned.units
