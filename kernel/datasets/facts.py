"""Public facts of a registered dataset: what a job's plan and cost may depend on.

See docs/privacy-model.md#public-facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DatasetFacts:
    n_rows: int
    feature_shape: tuple[int, ...]
    task: str  # "classification" | "regression" | "language-model"
    n_classes: int | None
    vocab_size: int | None = None
    """Text datasets: the tokenizer's vocabulary size (token ids are below it); None otherwise."""
    pad_id: int | None = None
    """Text datasets: the id rows are right-padded with; None otherwise."""
    n_units: int | None = None
    """Datasets with a privacy unit column: the number of units (persons); None: the unit is a row."""
    privacy_unit_column: str | None = None

    @property
    def n_features(self) -> int:
        return math.prod(self.feature_shape)

    @property
    def n_privacy_units(self) -> int:
        """How many units the neighbouring relation counts: what sampling rates and δ < 1/n are over."""
        return self.n_rows if self.n_units is None else self.n_units

    @property
    def unit_level(self) -> bool:
        return self.n_units is not None


def privacy_unit_text(column: str | None) -> str:
    """What one privacy unit is, in words (the dataset view and the report)."""
    return "one row" if column is None else f"one {column} and all its rows"


@dataclass(frozen=True)
class PublicClassList:
    """A classification dataset's public class list and where it came from (docs/privacy-model.md §2)."""

    names: tuple[str, ...]
    source: Literal["declared", "observed"]  # by the owner at upload | taken from the labels found


def public_class_list(
    *, task: str, n_classes: int | None, class_names: list[str] | None, declared: bool
) -> PublicClassList | None:
    """The list shown to everyone who may read the dataset; None for regression.

    Datasets registered before class lists were recorded have no names: their list is the label
    indices 0 .. n_classes - 1, which were taken from the labels found ("observed").
    """
    if task != "classification" or n_classes is None:
        return None
    names = tuple(class_names) if class_names else tuple(str(i) for i in range(n_classes))
    return PublicClassList(names=names, source="declared" if declared else "observed")
