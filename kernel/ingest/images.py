"""Image datasets: which uploads are images, their options, and the one call that parses them.

An image dataset is kept as the compact uint8 array (n, H, W, C) it decodes to (channels-last,
as numpy users hold images); the worker normalises it to float (x / 255) in the model's
(C, H, W) layout batch by batch. Its public ``feature_shape`` is that model layout, (C, H, W),
the same as a channels-first NPZ of floats, so models and size checks treat both alike.

Which uploads are images: ``format=zip`` always; ``format=npz`` when X is uint8 with 3 or 4
dimensions ((n, H, W) or (n, H, W, C)), unless the owner says ``modality=tabular`` (then X is
read as numbers, as before images existed); ``format=csv`` never.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

import numpy as np

from kernel.ingest.classes import task_for_class_list
from kernel.ingest.dataset import ClassList, IngestFacts, Task
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.image_decode import DecodeRules
from kernel.ingest.image_zip import read_image_zip, zip_folder_labels
from kernel.ingest.labels import check_task, resolve_labels
from kernel.ingest.limits import IngestLimits
from kernel.ingest.npz_reader import labels_as_numbers, npz_features_header, read_npz_arrays, read_npz_labels
from kernel.ingest.registry import RawLabels, RowPositions

Modality = Literal["tabular", "image"]
MODALITIES: tuple[Modality, ...] = get_args(Modality)
IMAGE_CHANNELS = (1, 3)
MAX_IMAGE_SIDE = 4096
_SIZE = re.compile(r"^\s*(\d{1,5})\s*(?:[xX×]\s*(\d{1,5}))?\s*$")


@dataclass(frozen=True)
class ImageOptions:
    """The owner's image declarations at upload: all public, none depends on the images."""

    channels: int | None = None
    """1 (grey, mode L) or 3 (RGB); None: a ZIP takes it from its first image, an NPZ from X."""
    size: tuple[int, int] | None = None
    """(height, width) every ZIP image is resized to; None: all must share the first one's size."""

    def to_json(self) -> dict[str, object]:
        """For the upload's request digest (idempotency): only what was declared."""
        declared: dict[str, object] = {}
        if self.channels is not None:
            declared["channels"] = self.channels
        if self.size is not None:
            declared["image_size"] = list(self.size)
        return declared


def parse_image_size(text: str | None) -> tuple[int, int] | None:
    """``"28"`` → (28, 28); ``"32x24"`` → (32, 24) as height × width; None → None."""
    if text is None:
        return None
    match = _SIZE.match(text)
    if match is None:
        raise DatasetValidationError(
            "bad-image-options", "image_size must be HxW (e.g. 32x32) or a single side (e.g. 28)"
        )
    height = int(match.group(1))
    width = int(match.group(2)) if match.group(2) is not None else height
    if not (1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
        raise DatasetValidationError(
            "bad-image-options", f"image_size sides must be between 1 and {MAX_IMAGE_SIDE} pixels"
        )
    return height, width


def check_channels(channels: int | None) -> int | None:
    if channels is not None and channels not in IMAGE_CHANNELS:
        raise DatasetValidationError("bad-image-options", "channels must be 1 (grey) or 3 (RGB)")
    return channels


@dataclass(frozen=True, eq=False)
class ParsedImages:
    """An image dataset that passed every check."""

    images: np.ndarray = field(repr=False)
    """uint8, C-contiguous, (n, H, W, C) with C in {1, 3}."""
    y: np.ndarray = field(repr=False)
    """int64 class indices for classification, float32 targets for regression."""
    task: Task
    n_classes: int | None
    classes: ClassList | None

    @property
    def model_shape(self) -> tuple[int, int, int]:
        """(C, H, W): the layout the models see, and the dataset's public feature shape."""
        _n, height, width, channels = self.images.shape
        return int(channels), int(height), int(width)


def image_facts(parsed: ParsedImages) -> IngestFacts:
    """The public facts of an image dataset (n and the shape are public, as for any dataset)."""
    shape = parsed.model_shape
    return IngestFacts(
        n_rows=int(parsed.images.shape[0]),
        feature_shape=shape,
        n_features=shape[0] * shape[1] * shape[2],
        task=parsed.task,
        n_classes=parsed.n_classes,
        n_units=None,
    )


def resolve_modality(
    path: Path, *, fmt: str, declared: str | None, options: ImageOptions, limits: IngestLimits
) -> Modality:
    """Image or tabular, from the format, the NPZ header's dtype and shape, and ``declared``."""
    if declared is not None and declared not in MODALITIES:
        raise DatasetValidationError("bad-image-options", "modality must be tabular or image")
    if fmt == "zip":
        if declared == "tabular":
            raise DatasetValidationError("bad-image-options", "a ZIP upload is a folder of images: modality=image")
        return "image"
    if fmt == "npz" and declared != "tabular":
        shape, dtype = npz_features_header(path, limits=limits)
        if dtype == np.uint8 and len(shape) in (3, 4):
            return "image"
        if declared == "image":
            raise DatasetValidationError(
                "bad-image-options",
                f"X has dtype {dtype.str!r} and {len(shape)} dimensions; an image NPZ needs uint8 X of "
                "shape (n, H, W) or (n, H, W, C)",
            )
    elif declared == "image":
        raise DatasetValidationError("bad-image-options", "only format=zip and format=npz can hold images")
    if options != ImageOptions():
        raise DatasetValidationError(
            "bad-image-options", "image_size= and channels= apply only to image datasets (ZIP, or NPZ of uint8 X)"
        )
    return "tabular"


def parse_images(
    path: Path,
    *,
    fmt: str,
    task: str | None,
    classes: tuple[str, ...] | None,
    limits: IngestLimits,
    options: ImageOptions,
) -> ParsedImages:
    """Decode and validate an image upload (ZIP of class folders, or NPZ of uint8 X)."""
    requested = check_task(task_for_class_list(task, classes))
    check_channels(options.channels)
    if fmt == "zip":
        return _from_zip(path, task=requested, classes=classes, limits=limits, options=options)
    return _from_npz(path, task=requested, classes=classes, limits=limits, options=options)


def _from_zip(
    path: Path, *, task: Task | None, classes: tuple[str, ...] | None, limits: IngestLimits, options: ImageOptions
) -> ParsedImages:
    if task == "regression":
        raise DatasetValidationError(
            "bad-image-options", "a ZIP of class folders is a classification dataset; task=regression needs an NPZ"
        )
    found = read_image_zip(
        path,
        limits=limits,
        rules=DecodeRules(max_pixels=limits.max_image_pixels, channels=options.channels, size=options.size),
    )
    if classes is None:
        names, y = found.folders, found.folder_index
    else:
        names, y = classes, _folder_labels(found.folders, found.folder_index, classes=classes)
    if np.unique(y).size < 2:
        raise DatasetValidationError(
            "bad-labels", "all images are in one class folder; classification needs at least 2"
        )
    return ParsedImages(
        images=found.images,
        y=np.ascontiguousarray(y, dtype=np.int64),
        task="classification",
        n_classes=len(names),
        classes=ClassList(names=tuple(names), declared=classes is not None),
    )


def _from_npz(
    path: Path, *, task: Task | None, classes: tuple[str, ...] | None, limits: IngestLimits, options: ImageOptions
) -> ParsedImages:
    if options.size is not None:
        raise DatasetValidationError(
            "bad-image-options", "image_size= resizes ZIP images; resize an NPZ's images before saving it"
        )
    features, raw_labels = read_npz_arrays(path, limits=limits)
    images = features[:, :, :, np.newaxis] if features.ndim == 3 else features
    channels = int(images.shape[3])
    if channels not in IMAGE_CHANNELS:
        raise DatasetValidationError(
            "bad-image-options", f"X has {channels} channels (last axis); image datasets have 1 (grey) or 3 (RGB)"
        )
    if options.channels is not None and options.channels != channels:
        raise DatasetValidationError(
            "bad-image-options", f"channels={options.channels} was declared but X has {channels} (its last axis)"
        )
    labels = resolve_labels(
        RawLabels(numbers=labels_as_numbers(raw_labels)),
        task=task,
        classes=classes,
        max_classes=limits.max_classes,
        rows=RowPositions(),
    )
    return ParsedImages(
        images=np.ascontiguousarray(images, dtype=np.uint8),
        y=labels.y,
        task=labels.task,
        n_classes=labels.n_classes,
        classes=labels.classes,
    )


def parse_image_labels(
    path: Path, *, fmt: str, task: str | None, classes: tuple[str, ...] | None, limits: IngestLimits
) -> np.ndarray:
    """The labels of an image upload without decoding an image, mapped to ``classes`` (the
    dataset's public class list) exactly as at upload: the worker reads the images themselves
    from their decoded array, whose rows are in the same order."""
    requested = check_task(task_for_class_list(task, classes))
    if fmt == "zip":
        if classes is None:
            raise DatasetValidationError("bad-class-list", "a ZIP image dataset needs its class list")
        folders, folder_index = zip_folder_labels(path, limits=limits)
        return _folder_labels(folders, folder_index, classes=classes)
    labels = resolve_labels(
        RawLabels(numbers=labels_as_numbers(read_npz_labels(path, limits=limits))),
        task=requested,
        classes=classes,
        max_classes=limits.max_classes,
        rows=RowPositions(),
    )
    return labels.y


def _folder_labels(folders: tuple[str, ...], folder_index: np.ndarray, *, classes: tuple[str, ...]) -> np.ndarray:
    """Each image's class index in ``classes``, matched by folder name; every folder must be listed."""
    position = {name: index for index, name in enumerate(classes)}
    unknown = [name for name in folders if name not in position]
    if unknown:
        raise DatasetValidationError(
            "label-not-in-classes", f"the class folder {unknown[0]!r} is not in the declared class list"
        )
    by_folder = np.array([position[name] for name in folders], dtype=np.int64)
    labels: np.ndarray = by_folder[folder_index]
    return labels
