"""Training per privacy unit (a dataset with a privacy unit column): the DP per-sample-map family.

The loop samples units and hands the aggregator a (b, k, ...) batch: row slot j of sampled unit
u (dp/data/units.py). `PerUnitAggregator` runs the job's own aggregator on it with each unit
as one "row": the model is applied to every slot (`AugmentedViews`, the same wrapper augmentation
multiplicity uses, so both per-sample engines accept it unchanged) and the loss is the mean over
the k slots, so the per-sample gradient the map clips is the mean of the unit's rows' gradients.
One unit therefore contributes one mapped vector of norm at most the map's bound: the sum's
add/remove sensitivity over units is the bound, exactly what the API charged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from dp.data.units import UnitIndex
from dp.loop.augmult import stacked_sum
from dp.loop.batch_loop import UnitSampling
from dp.losses import mean_over_unit_rows
from dp.per_example.aggregator import BatchAggregator, BatchContext, TensorDict

__all__ = ["PerUnitAggregator", "unit_sampling", "unit_slots"]


@dataclass(frozen=True)
class PerUnitAggregator(BatchAggregator):
    """The job's aggregator over units: each unit's k row slots averaged, then mapped as one."""

    inner: BatchAggregator
    rows_per_unit: int

    @property
    def sensitivity(self) -> float:
        return self.inner.sensitivity

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        if X.dim() < 2 or X.shape[1] != self.rows_per_unit or y.shape[:2] != X.shape[:2]:
            raise ValueError(f"a per-unit batch is (b, {self.rows_per_unit}, ...) features with (b, k) targets")
        return stacked_sum(self.inner, model, X, y, replace(context, loss=mean_over_unit_rows(context.loss)))


def unit_slots(units: UnitIndex | None, *, rows_per_unit: int | None) -> UnitSampling | None:
    """How a job on a privacy unit dataset draws its units' row slots (None: rows are units)."""
    if units is None:
        return None
    if rows_per_unit is None:
        raise ValueError("a job on a privacy unit dataset needs training.rows_per_unit (the planner fills it in)")
    return UnitSampling(index=units, rows_per_unit=rows_per_unit)


def unit_sampling(
    aggregator: BatchAggregator, units: UnitIndex | None, *, rows_per_unit: int | None
) -> tuple[BatchAggregator, UnitSampling | None]:
    """The aggregator and the loop's sampling for a job: per unit when the dataset has units."""
    sampling = unit_slots(units, rows_per_unit=rows_per_unit)
    if sampling is None:
        return aggregator, None
    return PerUnitAggregator(aggregator, sampling.rows_per_unit), sampling
