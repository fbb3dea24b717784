"""Parsing and validation of uploaded datasets (CSV, NPZ); torch-free, shared by API and worker."""

from app.ingest.classes import parse_class_list
from app.ingest.dataset import TASKS, ClassList, IngestFacts, ParsedDataset, Task, dataset_facts
from app.ingest.errors import REASONS, DatasetValidationError, Reason
from app.ingest.limits import IngestLimits
from app.ingest.parse import SUPPORTED_FORMATS, parse_dataset
from app.ingest.preparation import Preparation, parse_preparation, preparation_from_json, preparation_report

__all__ = [
    "REASONS",
    "SUPPORTED_FORMATS",
    "TASKS",
    "ClassList",
    "DatasetValidationError",
    "IngestFacts",
    "IngestLimits",
    "ParsedDataset",
    "Preparation",
    "Reason",
    "Task",
    "dataset_facts",
    "parse_class_list",
    "parse_dataset",
    "parse_preparation",
    "preparation_from_json",
    "preparation_report",
]
