"""A registered dataset's public facts, read from its row: what job planning and a job's init
provenance size models and price jobs by.

Apart from kernel/datasets/facts.py, which the torch-free algorithm definitions import, so that
they do not load the database model with it.
"""

from __future__ import annotations

from kernel.datasets.facts import DatasetFacts
from kernel.db.orm import Dataset

__all__ = ["facts_of"]


def facts_of(dataset: Dataset) -> DatasetFacts:
    return DatasetFacts(
        n_rows=dataset.n_rows,
        feature_shape=tuple(dataset.feature_shape),
        task=dataset.task,
        n_classes=dataset.n_classes,
        vocab_size=dataset.vocab_size,
        pad_id=dataset.pad_id,
        n_units=dataset.n_units,
        privacy_unit_column=dataset.privacy_unit_column,
    )
