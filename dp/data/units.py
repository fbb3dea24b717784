"""Rows grouped by privacy unit (a dataset with a privacy unit column), and a step's rows per unit.

A step samples units, not rows (Poisson over the units, rate q); each sampled unit then gives
``rows_per_unit`` = k row slots, filled from a uniformly random ordering of the unit's rows drawn
from the job's SecureRandom: k distinct rows when it has at least k, else all of them repeated in
turn (slot j takes the (j mod m)-th of its m rows). The slots depend only on the unit's own rows
and on randomness independent of the data, so what one unit contributes to a step is a function
of that unit alone, and removing the unit removes exactly its contribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dp.randomness.secure_random import SecureRandom

__all__ = ["UnitIndex"]


@dataclass(frozen=True)
class UnitIndex:
    """Which rows belong to which unit, in CSR form on the training device."""

    offsets: torch.Tensor
    """int64 (U + 1,): unit u's rows are ``rows[offsets[u]:offsets[u + 1]]``."""
    rows: torch.Tensor
    """int64 (n,): row positions ordered by unit."""

    @classmethod
    def from_codes(cls, codes: np.ndarray, *, device: torch.device | str = "cpu") -> UnitIndex:
        """From each row's unit code (any integers: they are renumbered 0 .. U - 1)."""
        codes = np.asarray(codes)
        if codes.ndim != 1 or codes.shape[0] == 0:
            raise ValueError("a unit index needs one unit code per row, and at least one row")
        _ids, compact = np.unique(codes, return_inverse=True)
        order = np.argsort(compact, kind="stable")
        counts = np.bincount(compact)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        return cls(
            offsets=torch.from_numpy(offsets).to(device),
            rows=torch.from_numpy(order.astype(np.int64)).to(device),
        )

    @property
    def n_units(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def device(self) -> torch.device:
        return self.rows.device

    def row_weights(self, n_rows: int) -> torch.Tensor:
        """1/m for each row of a unit with m rows (float64, (n,)): a unit's weights sum to 1."""
        counts = self.offsets[1:] - self.offsets[:-1]
        weights = torch.empty(n_rows, dtype=torch.float64, device=self.device)
        weights[self.rows] = torch.repeat_interleave(1.0 / counts.to(torch.float64), counts)
        return weights

    def slots(self, units: torch.Tensor, *, rows_per_unit: int, generator: SecureRandom) -> torch.Tensor:
        """(b, k) row positions for the sampled ``units`` (b,): see the module docstring."""
        if rows_per_unit < 1:
            raise ValueError(f"rows_per_unit must be >= 1, got {rows_per_unit}")
        units = units.to(self.device)
        starts = self.offsets[units]
        counts = self.offsets[units + 1] - starts
        if units.numel() == 0:
            return torch.empty((0, rows_per_unit), dtype=torch.int64, device=self.device)
        # Every row of every sampled unit, grouped by unit, then shuffled within its unit by
        # sorting (unit, uniform key): a uniformly random ordering of each unit's rows.
        owner = torch.repeat_interleave(torch.arange(units.numel(), device=self.device), counts)
        first = torch.cumsum(counts, 0) - counts
        within = torch.arange(int(owner.numel()), device=self.device) - first[owner]
        members = self.rows[starts[owner] + within]
        keys = generator.uniform(int(owner.numel()), dtype=torch.float64).to(self.device)
        shuffled = members[torch.argsort(owner.to(torch.float64) + keys)]
        slot = torch.arange(rows_per_unit, device=self.device)
        return shuffled[first[:, None] + slot[None, :] % counts[:, None]]
