"""prv-accountant (Gopi, Lee & Wutschitz 2021) behind the accountant contract: a tight single-job
bound for compositions of Gaussian, subsampled-Gaussian, Laplace and pure-DP mechanisms (and the
leaves they dominate, :mod:`kernel.privacy.dominating`). Not a valid filter over adaptively chosen
jobs, so never the ledger's (docs/privacy-model.md#known-traps); the maths is :mod:`kernel.privacy.prv`.
"""

from __future__ import annotations

from typing import ClassVar

from kernel.privacy.accountant import Role, failed, registered
from kernel.privacy.dominating import DominatedLeafAccountant
from kernel.privacy.prv import prv_epsilon


@registered
class PrvAccountant(DominatedLeafAccountant):
    """prv-accountant's upper bound at δ; no number (AccountantFailed) where its numerics fail."""

    method: ClassVar[str] = "prv"
    role: ClassVar[Role] = Role.NUMERIC
    LABEL: ClassVar[str] = "tight single-job upper bound (prv-accountant); not used by the ledger"

    def epsilon(self, delta: float) -> float:
        value = prv_epsilon(self.dominating_event(), delta)
        if value is None:
            raise failed(self, "its numerics gave no trustworthy bound (or δ is below its range)")
        return value
