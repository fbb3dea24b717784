"""The validated dataset handed to the API and the worker, and its facts that are public."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, TypedDict, get_args

import numpy as np

Task = Literal["classification", "regression"]
TASKS: tuple[Task, ...] = get_args(Task)


@dataclass(frozen=True)
class ClassList:
    """A classification dataset's class list: label index i is ``names[i]``."""

    names: tuple[str, ...]
    declared: bool
    """True when the owner declared it at upload; False when it was taken from the labels found."""


@dataclass(frozen=True, eq=False)
class ParsedDataset:
    """A dataset that passed every check; consumers need not re-validate it.

    ``eq=False`` because field-wise ``==`` on arrays is ambiguous; compare arrays explicitly.
    X and y stay out of the repr so that logging a dataset never prints its values.
    """

    X: np.ndarray = field(repr=False)
    """float32, C-contiguous, shape (n, d) or (n, C, H, W)."""
    y: np.ndarray = field(repr=False)
    """int64 class indices for classification, float32 targets for regression; shape (n,)."""
    task: Task
    n_classes: int | None
    """The class list's length for classification; None for regression."""
    feature_shape: tuple[int, ...]
    """X.shape[1:]."""
    feature_names: tuple[str, ...] | None
    """The features' names in order (the CSV header minus the label and dropped columns, one-hot
    columns expanded as ``column=category``); None for NPZ."""
    classes: ClassList | None = None
    """The class list the labels were mapped to; None for regression."""
    units: np.ndarray | None = field(default=None, repr=False)
    """int64 (n,): each row's privacy unit, 0 .. n_units - 1; None when the privacy unit is a row."""

    @property
    def n_units(self) -> int | None:
        """How many privacy units the rows belong to (public once registered); None: unit = row."""
        return None if self.units is None else int(self.units.max()) + 1


class IngestFacts(TypedDict):
    """What may be recorded and shown about a dataset: n and d are public (docs/privacy-model.md#public-facts)."""

    n_rows: int
    feature_shape: tuple[int, ...]
    n_features: int
    task: Task
    n_classes: int | None
    n_units: int | None
    """The number of privacy units (persons) when the owner named a privacy unit column."""


def dataset_facts(parsed: ParsedDataset) -> IngestFacts:
    """The public facts of a parsed dataset, as plain Python values ready for JSON or the DB."""
    feature_shape = tuple(int(size) for size in parsed.feature_shape)
    return IngestFacts(
        n_rows=int(parsed.X.shape[0]),
        feature_shape=feature_shape,
        n_features=math.prod(feature_shape),
        task=parsed.task,
        n_classes=parsed.n_classes,
        n_units=parsed.n_units,
    )
