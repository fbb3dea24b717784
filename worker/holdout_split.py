"""A job's rows split into training and DP hold-out parts, by rows or by privacy units.

The coins are per row, or on a dataset with a privacy unit column per unit (all of a unit's rows
on one side). The hold-out part carries each row's weight 1/m for a unit of m held-out rows, so a
unit's terms in the released metric add up to at most the metric's sensitivity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dp.data.rows import Rows, SubsetRows
from dp.data.units import UnitIndex

__all__ = ["Split", "coin_count", "split_rows"]


@dataclass(frozen=True)
class Split:
    X: Rows
    y: torch.Tensor
    units: UnitIndex | None
    """The training rows' units (None when the unit is a row, or no unit is left)."""
    X_eval: Rows | None = None
    y_eval: torch.Tensor | None = None
    eval_weights: torch.Tensor | None = None


def coin_count(n_rows: int, unit_codes: np.ndarray | None) -> int:
    """How many hold-out coins a dataset needs: one per row, or one per privacy unit."""
    return n_rows if unit_codes is None else int(unit_codes.max()) + 1


def split_rows(
    X: Rows,
    y: torch.Tensor,
    unit_codes: np.ndarray | None,
    held_out_coins: np.ndarray | None,
    *,
    device: torch.device,
) -> Split:
    """``held_out_coins``: one bool per row (or per unit when ``unit_codes`` is given); None: no hold-out."""
    if held_out_coins is None:
        return Split(X=X, y=y.to(device), units=_units(unit_codes, device))
    mask = held_out_coins if unit_codes is None else held_out_coins[unit_codes]
    held_out, kept = np.flatnonzero(mask), np.flatnonzero(~mask)
    eval_weights = (
        UnitIndex.from_codes(unit_codes[held_out]).row_weights(int(held_out.size))
        if unit_codes is not None and held_out.size
        else None
    )
    return Split(
        X=SubsetRows(X, kept),
        y=y[torch.from_numpy(kept)].to(device),
        units=_units(unit_codes[kept] if unit_codes is not None else None, device),
        X_eval=SubsetRows(X, held_out),
        y_eval=y[torch.from_numpy(held_out)],
        eval_weights=eval_weights,
    )


def _units(unit_codes: np.ndarray | None, device: torch.device) -> UnitIndex | None:
    return UnitIndex.from_codes(unit_codes, device=device) if unit_codes is not None and unit_codes.size else None
