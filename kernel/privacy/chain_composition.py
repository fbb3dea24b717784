"""The ε of several jobs' releases on the same rows together: the guarantee of a model fine-tuned
from a model trained on the same data (docs/privacy-model.md#init-chain).

A model that starts from the model of an earlier job on the same dataset is a function of both
jobs' releases, so its guarantee is their composition. Two numbers, like a single job's:

* **ledger terms**: the jobs' committed Rényi curves summed order-wise (exactly what the ledger
  added when each job committed) and converted at δ/|orders|, the ledger's own conversion
  (:class:`kernel.privacy.rdp_accountant.RdpAccountant`), plus the best single-order conversion at δ;
* **tight**: the single-job methods of :mod:`kernel.privacy.single_job` (exact Gaussian-DP profile,
  optimal pure-DP composition, PRV, PLD, RDP at δ) applied to the composition of the events as one
  :class:`ComposedEvent`; for an event containing tuning only the RDP conversions apply.

Both take the events as they were committed: the second job's event was fixed at its submission,
after the first job's model was released, so like every per-job number these bounds describe the
realised sequence of mechanisms. The bound that holds whatever was chosen after seeing earlier
releases is the dataset's budget (ε_G, δ_G), which the ledger's filter enforces over all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernel.privacy.conversion import epsilon_from_rdp, validate_delta
from kernel.privacy.errors import PrivacyEventError
from kernel.privacy.events import ComposedEvent, PrivacyEvent
from kernel.privacy.orders import Curve
from kernel.privacy.rdp_accountant import RdpAccountant
from kernel.privacy.single_job import SingleJobEpsilon, capped_single_job_epsilon, single_job_epsilon


@dataclass(frozen=True)
class ComposedGuarantee:
    """The (ε, δ) of several releases on the same rows, in ledger terms and tight."""

    events: int
    delta: float
    curve: Curve
    """The order-wise sum of the events' RDP curves (what the ledger added for them)."""
    ledger_epsilon: float
    """``curve`` converted at δ/|orders|: the ledger's conversion, comparable with a job's ledger ε."""
    rdp_epsilon: float
    rdp_order: float
    """The best single-order conversion of ``curve`` at δ itself, and its order."""
    tight: SingleJobEpsilon
    """The smallest valid bound of the single-job methods for the composed event."""


def summed_curve(events: Sequence[PrivacyEvent]) -> Curve:
    """Σ rdp_curve(event), order-wise and rounded up, in the order given: the ledger's accountant."""
    return _ledger_accountant(events).curve


def _ledger_accountant(events: Sequence[PrivacyEvent]) -> RdpAccountant:
    if not events:
        raise PrivacyEventError("a composition needs at least one event")
    accountant = RdpAccountant()
    for event in events:
        accountant.compose(event)
    return accountant


def compose_guarantee(
    events: Sequence[PrivacyEvent],
    delta: float,
    *,
    zcdp_is_gaussian: bool,
    numeric: bool,
) -> ComposedGuarantee:
    """The guarantee of ``events`` composed, at ``delta``.

    ``zcdp_is_gaussian``: whether every zCDP leaf of every event is a Gaussian release (True only
    when every composed job's algorithm declares it; False is always valid). ``numeric``: run
    prv-accountant/PLD in the capped child process (off the request path: the worker), else the
    closed forms only (bounded time: estimates)."""
    delta = validate_delta(delta)
    ledger = _ledger_accountant(events)
    curve = ledger.curve
    rdp_epsilon, rdp_order = epsilon_from_rdp(curve, delta)
    composed = ComposedEvent(events=tuple(events)) if len(events) > 1 else events[0]
    if numeric:
        tight = capped_single_job_epsilon(composed, delta, zcdp_is_gaussian=zcdp_is_gaussian)
    else:
        tight = single_job_epsilon(composed, delta, zcdp_is_gaussian=zcdp_is_gaussian, numeric=False)
    return ComposedGuarantee(
        events=len(events),
        delta=delta,
        curve=curve,
        ledger_epsilon=ledger.epsilon(delta),
        rdp_epsilon=rdp_epsilon,
        rdp_order=rdp_order,
        tight=tight,
    )
