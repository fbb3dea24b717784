"""The exact single-job bound of a job whose every mechanism is ε0-DP with one common ε0: the optimal
composition of k adaptively chosen ε0-DP mechanisms (Kairouz, Oh & Viswanath 2015), the privacy
profile of k-fold randomized response. An ε0-bounded-range leaf (exponential mechanism) is ε0-DP.
Not used by the ledger (docs/single-job-epsilon.md).
"""

from __future__ import annotations

import math
from typing import ClassVar, Final

import numpy as np
from scipy.special import gammaln

from kernel.privacy.accountant import Role, epsilon_query, failed, registered
from kernel.privacy.conversion import validate_delta
from kernel.privacy.epsilon_search import delta_upper_bound, smallest_epsilon
from kernel.privacy.events import ExponentialMechanismEvent, LeafEvent, PureDPEvent
from kernel.privacy.leaf_accountant import LeafAccountant

PURE_DP_MAX_COUNT: Final[int] = 200_000
"""pure-dp-optimal sums k + 1 binomial terms per bisection step (~200 steps): above this count it
is refused (rdp-single-job still bounds the job), so its time and memory stay bounded."""


def pure_dp_composition_log_delta(*, epsilon0: float, count: int, epsilon: float) -> float:
    """log δ(ε) of k-fold randomized response with parameter ε0 (the optimal adaptive composition
    of k ε0-DP mechanisms, Kairouz-Oh-Viswanath 2015 Thm 3.3):

        δ(ε) = Σ_{l=0}^{k} C(k, l) [ (1−p)^{k−l} p^l − e^ε p^{k−l} (1−p)^l ]_+ ,  p = 1/(1 + e^{ε0}),

    (l, ``unlikely`` below, = number of coordinates on P's less likely side; the bracket is
    positive iff ε0·(k − 2l) > ε), summed in log space so k up to 10^5 neither over- nor underflows."""
    k = int(count)
    unlikely = np.arange(k + 1, dtype=np.float64)
    loss = epsilon0 * (k - 2.0 * unlikely)
    keep = loss > epsilon
    if not keep.any():
        return -math.inf
    unlikely, loss = unlikely[keep], loss[keep]
    log_p = -np.logaddexp(0.0, epsilon0)  # log 1/(1+e^ε0)
    log_1mp = -np.logaddexp(0.0, -epsilon0)  # log e^ε0/(1+e^ε0)
    log_binom = gammaln(k + 1.0) - gammaln(unlikely + 1.0) - gammaln(k - unlikely + 1.0)
    log_p_mass = log_binom + (k - unlikely) * log_1mp + unlikely * log_p
    terms = log_p_mass + np.log1p(-np.exp(epsilon - loss))  # Q mass / P mass = e^{−loss}
    return float(np.logaddexp.reduce(terms))


def pure_dp_composition_epsilon(*, epsilon0: float, count: int, delta: float) -> float:
    """The smallest ε with δ(ε) ≤ δ for k adaptively composed ε0-DP mechanisms, rounded up."""
    delta = validate_delta(delta)
    if count == 0:
        return 0.0
    return smallest_epsilon(
        lambda eps: pure_dp_composition_log_delta(epsilon0=epsilon0, count=count, epsilon=eps),
        delta=delta,
        upper=epsilon0 * count,
    )


_PURE = (PureDPEvent, ExponentialMechanismEvent)


@registered
class PureDpOptimalAccountant(LeafAccountant):
    """Every mechanism ε0-DP for one common ε0: the optimal composition's exact profile.

    Supports depends on what is composed: an event whose ε0 differs from the composed ones' is
    outside the model (the heterogeneous optimum is #P-hard to compute)."""

    method: ClassVar[str] = "pure-dp-optimal"
    role: ClassVar[Role] = Role.EXACT
    LABEL: ClassVar[str] = (
        "tight single-job upper bound: optimal composition of pure-DP / bounded-range steps "
        "(Kairouz-Oh-Viswanath); not used by the ledger"
    )

    def epsilon(self, delta: float) -> float:
        epsilon0, count = self._parameters()
        return pure_dp_composition_epsilon(epsilon0=epsilon0, count=count, delta=delta)

    def delta(self, epsilon: float) -> float:
        epsilon = epsilon_query(epsilon)
        epsilon0, count = self._parameters()
        if count == 0:
            return 0.0
        return delta_upper_bound(pure_dp_composition_log_delta(epsilon0=epsilon0, count=count, epsilon=epsilon))

    def _parameters(self) -> tuple[float, int]:
        """(ε0, k) of the composition; refused above PURE_DP_MAX_COUNT (bounded time)."""
        leaves = self.leaves
        count = sum(leaf.count for leaf in leaves)
        if count > PURE_DP_MAX_COUNT:
            raise failed(self, f"{count} uses are more than the {PURE_DP_MAX_COUNT} it sums in bounded time")
        return (leaves[0].epsilon if leaves else 0.0), count  # type: ignore[union-attr]  # ε0-DP leaves only

    def _leaf_unsupported(self, leaf: LeafEvent) -> str | None:
        return None if isinstance(leaf, _PURE) else "not a pure ε0-DP or ε0-bounded-range mechanism"

    def _leaves_unsupported(self, used: list[LeafEvent]) -> str | None:
        epsilons = {leaf.epsilon for leaf in (*self.leaves, *used)}  # type: ignore[union-attr]  # checked above
        return None if len(epsilons) <= 1 else "its mechanisms do not share one ε0"
