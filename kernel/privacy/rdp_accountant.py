"""The ledger's accountant: RDP curves on the fixed order grid, summed order-wise
(docs/privacy-model.md#ledger).

RDP composes over adaptively chosen jobs, so it is the only accountant the budget filter uses; its
curve is what a ledger entry stores. ε at δ is the ledger's conversion at δ/|orders| (the union
bound over the per-order filters); nothing spent (an all-zero curve) is exactly ε = 0, δ = 0.
The per-kind formulas are :mod:`kernel.privacy.rdp`; every event kind has one.
"""

from __future__ import annotations

from typing import ClassVar

from kernel.privacy.accountant import PrivacyAccountant, Role, epsilon_query, registered
from kernel.privacy.conversion import delta_from_rdp, ledger_epsilon, validate_delta
from kernel.privacy.curves import add_curves, scale_curve, zero_curve
from kernel.privacy.events import PrivacyEvent
from kernel.privacy.orders import ORDERS, Curve
from kernel.privacy.rdp import rdp_curve, unsupported_by_rdp
from kernel.privacy.rounding import round_up


@registered
class RdpAccountant(PrivacyAccountant):
    """The order-wise sum of the composed events' RDP curves, in the order composed.

    The first event's curve is taken as it is, so one event's curve is exactly its
    :func:`~kernel.privacy.rdp.rdp_curve`, and a sequence's is what the ledger adds for it."""

    method: ClassVar[str] = "rdp"
    role: ClassVar[Role] = Role.LEDGER
    LABEL: ClassVar[str] = "the ledger's RDP number (no tighter single-job bound applied)"

    def __init__(self, *, zcdp_is_gaussian: bool = False) -> None:
        super().__init__(zcdp_is_gaussian=zcdp_is_gaussian)
        self._curve: Curve | None = None

    @property
    def curve(self) -> Curve:
        """The composed cost on ORDERS (all zero when nothing is composed)."""
        return zero_curve() if self._curve is None else self._curve

    def epsilon(self, delta: float) -> float:
        delta = validate_delta(delta)
        curve = self.curve
        if not any(curve):
            return 0.0
        return ledger_epsilon(curve, delta)

    def delta(self, epsilon: float) -> float:
        """|orders| times the best order's δ (the ledger's union bound), capped at 1."""
        epsilon = epsilon_query(epsilon)
        curve = self.curve
        if not any(curve):
            return 0.0
        return min(1.0, round_up(len(ORDERS) * delta_from_rdp(curve, epsilon)))

    def _unsupported(self, event: PrivacyEvent) -> str | None:
        return unsupported_by_rdp(event)

    def _compose(self, event: PrivacyEvent, count: int) -> None:
        cost = scale_curve(rdp_curve(event), count)
        self._curve = cost if self._curve is None else add_curves(self._curve, cost)
