"""Public facts of a registered dataset: what a job's plan and cost may depend on (privacy.md §1)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetFacts:
    n_rows: int
    feature_shape: tuple[int, ...]
    task: str  # "classification" | "regression"
    n_classes: int | None

    @property
    def n_features(self) -> int:
        return math.prod(self.feature_shape)
