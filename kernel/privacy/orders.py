"""The fixed grid of Rényi orders on which every curve in the ledger is stored.

The grid is part of the stored data: a curve is a tuple of numbers that only means something
together with ``ORDERS_VERSION``. Changing the grid needs a new version and a migration of all
stored curves, never an in-place edit.
"""

from __future__ import annotations

from typing import Final

ORDERS: Final[tuple[float, ...]] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0,
    10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0,
)  # fmt: skip
ORDERS_VERSION: Final[str] = "orders/v1"

Curve = tuple[float, ...]
