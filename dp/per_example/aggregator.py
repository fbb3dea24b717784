"""What the DP-SGD loop asks of a step's data part: a bounded sum and its sensitivity.

Every aggregator (a per-sample map on either engine, DC-DPSGD's split, DiceSGD's error feedback,
and the wrappers for privacy units and augmentation multiplicity) subclasses `BatchAggregator`:
the loop calls `clipped_sum` with keywords, written here once, and each aggregator implements
`sum_batch` on the packed `BatchContext`, which a wrapper hands on (changed where it must be)
to the aggregator it wraps.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

from dp.per_example.per_sample import PerSampleMap, TensorDict
from dp.randomness.secure_random import SecureRandom

__all__ = ["BatchAggregator", "BatchContext", "MapAggregator", "TensorDict"]


@dataclass(frozen=True)
class BatchContext:
    """What a step hands an aggregator besides the model and the rows."""

    step: int
    loss: str
    """A registered loss (dp/losses.py)."""
    max_physical_batch_size: int
    """Rows per per-sample-gradient chunk: bounds memory only, never changes the result."""
    generator: SecureRandom
    """The job's SecureRandom, for data-independent randomness only."""


class BatchAggregator(ABC):
    """The released sum's data part: Σ over the batch of bounded per-sample contributions.

    `sensitivity` is the add/remove L2 sensitivity of that sum for every possible batch; the
    loop adds N(0, (σ·sensitivity)² I). Per-sample maps (clipping, normalisation) are one kind;
    rules that look at the whole batch (DC-DPSGD's rank rule) implement this directly.
    """

    @property
    @abstractmethod
    def sensitivity(self) -> float: ...

    def clipped_sum(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        step: int,
        loss: str,
        max_physical_batch_size: int,
        generator: SecureRandom,
    ) -> TensorDict:
        """The step's sum over the rows of (X, y), by parameter name. PRIVATE: release it through
        noise only."""
        context = BatchContext(
            step=step, loss=loss, max_physical_batch_size=max_physical_batch_size, generator=generator
        )
        return self.sum_batch(model, X, y, context)

    @abstractmethod
    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        """`clipped_sum` on the packed context: what each aggregator implements."""


@dataclass(frozen=True)
class MapAggregator(BatchAggregator):
    """Σ_i scale_i·g_i for a per-sample map (clipping, normalisation), on either engine: every row
    contributes at most the map's norm bound, which is therefore the sum's sensitivity."""

    per_sample_map: PerSampleMap

    @property
    def sensitivity(self) -> float:
        return self.per_sample_map.norm_bound
