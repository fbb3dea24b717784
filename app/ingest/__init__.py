"""Parsing and validation of uploaded datasets (CSV, NPZ); torch-free, shared by API and worker."""

from app.ingest.classes import parse_class_list
from app.ingest.dataset import TASKS, IngestFacts, ParsedDataset, Task, dataset_facts
from app.ingest.errors import REASONS, DatasetValidationError, Reason
from app.ingest.limits import IngestLimits
from app.ingest.parse import SUPPORTED_FORMATS, parse_dataset

__all__ = [
    "REASONS",
    "SUPPORTED_FORMATS",
    "TASKS",
    "IngestFacts",
    "DatasetValidationError",
    "IngestLimits",
    "ParsedDataset",
    "Reason",
    "Task",
    "dataset_facts",
    "parse_class_list",
    "parse_dataset",
]
