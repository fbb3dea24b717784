"""A paper's own privacy number, shown beside the ledger ε but never charged.

Several papers behind the catalogue publish calibrations that do not hold (docs/privacy-model.md#known-traps). Users
comparing with a paper still want to see its number, so a report may carry it, always under
:data:`PAPER_CLAIM_LABEL` and with ``valid_guarantee: false``. One helper builds that entry so
every algorithm labels it the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from kernel.privacy import PoissonSampledGaussianEvent
from kernel.privacy.conversion import epsilon_from_rdp
from kernel.privacy.rdp import rdp_curve

__all__ = ["PAPER_CLAIM_LABEL", "claim_entry", "finite_or_none", "poisson_gaussian_rdp_epsilon", "stated_claim_entry"]

PAPER_CLAIM_LABEL: Final[str] = "as claimed in the paper — not a valid guarantee"


def finite_or_none(value: float) -> float | None:
    """JSON has no ∞: an unbounded claim is reported as null."""
    return value if math.isfinite(value) else None


def claim_entry(
    *, epsilon: float, delta: float, explanation: str, details: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The report entry: label, the claimed (ε, δ), named details, and why it is not valid."""
    entry: dict[str, Any] = {"label": PAPER_CLAIM_LABEL, "epsilon": finite_or_none(epsilon), "delta": delta}
    for name, value in (details or {}).items():
        entry[name] = finite_or_none(value)
    entry["valid_guarantee"] = False
    entry["explanation"] = explanation
    return entry


def stated_claim_entry(*, claim: str, explanation: str) -> dict[str, Any]:
    """The report entry of a claim stated without a number: label, the claim, and why it is not valid."""
    return {"label": PAPER_CLAIM_LABEL, "claim": claim, "valid_guarantee": False, "explanation": explanation}


def poisson_gaussian_rdp_epsilon(
    *, sampling_probability: float, noise_multiplier: float, steps: int, delta: float
) -> float:
    """ε at δ of `steps` Poisson-subsampled Gaussians via RDP, as the papers' code computes it
    (∞ without noise, 0 for no steps)."""
    if noise_multiplier <= 0.0:
        return math.inf
    if steps == 0:
        return 0.0
    event = PoissonSampledGaussianEvent(
        sampling_probability=sampling_probability, noise_multiplier=noise_multiplier, count=steps
    )
    return epsilon_from_rdp(rdp_curve(event), delta)[0]
