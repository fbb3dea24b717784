"""Parsing and validation of uploaded datasets (CSV, NPZ, ZIP of images); torch-free, shared by API and worker."""

from kernel.ingest.classes import parse_class_list
from kernel.ingest.dataset import TASKS, ClassList, IngestFacts, ParsedDataset, Task, dataset_facts
from kernel.ingest.errors import IMAGE_REASONS, REASONS, DatasetValidationError, Reason
from kernel.ingest.images import (
    ImageOptions,
    Modality,
    ParsedImages,
    check_channels,
    image_facts,
    parse_image_labels,
    parse_image_size,
    parse_images,
    resolve_modality,
)
from kernel.ingest.limits import IngestLimits
from kernel.ingest.parse import SUPPORTED_FORMATS, parse_dataset
from kernel.ingest.preparation import Preparation, parse_preparation, preparation_from_json, preparation_report

__all__ = [
    "IMAGE_REASONS",
    "REASONS",
    "SUPPORTED_FORMATS",
    "TASKS",
    "ClassList",
    "DatasetValidationError",
    "ImageOptions",
    "IngestFacts",
    "IngestLimits",
    "Modality",
    "ParsedDataset",
    "ParsedImages",
    "Preparation",
    "Reason",
    "Task",
    "check_channels",
    "dataset_facts",
    "image_facts",
    "parse_class_list",
    "parse_dataset",
    "parse_image_labels",
    "parse_image_size",
    "parse_images",
    "parse_preparation",
    "preparation_from_json",
    "preparation_report",
    "resolve_modality",
]
