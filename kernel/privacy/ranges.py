"""The parameter ranges the API accepts, in one place (docs/walkthrough.md, validated ranges).

Inside them every request-path computation (RDP curve, ledger ε, calibration, the closed-form
single-job ε) is known to return quickly with a finite answer; outside them the math overflows,
underflows or, in prv-accountant's series, never terminates. The schemas check them at the API
edge; :mod:`kernel.privacy.rdp` stays total outside them on its own.
"""

from __future__ import annotations

from typing import Final

NOISE_MULTIPLIER_MIN: Final[float] = 1e-3
NOISE_MULTIPLIER_MAX: Final[float] = 1e5
"""σ of a job (every algorithm's one scalar) and of a Gaussian evaluation. Calibration searches
wider ([1e-4, 1e6]) but never lands below 1e-3 for a target ε ≤ 100."""

DELTA_MIN: Final[float] = 1e-30
"""Smallest δ a new budget or job may ask for: below it prv-accountant's δ error underflows and
no ε means anything. The ledger math itself works in log δ and stays total on 0 < δ < 1, so rows
stored before this bound was enforced (δ = 5e-324) still get finite, conservative numbers."""


def range_text(low: float, high: float, *, high_open: bool = False) -> str:
    """'[low, high]' or '[low, high)' for a problem detail."""
    return f"[{low:g}, {high:g}{')' if high_open else ']'}"
