"""Every accountant of the service, registered, and the one way to pick one: ask ``supports``.

Importing this module registers them all (each module registers its class with
:func:`kernel.privacy.accountant.registered`); see docs/privacy-model.md#accountants for which
serves what.
"""

from __future__ import annotations

from kernel.privacy.accountant import ACCOUNTANTS, PrivacyAccountant, Role
from kernel.privacy.events import PrivacyEvent
from kernel.privacy.gaussian_dp import GaussianDpAccountant
from kernel.privacy.pld_accountant import PldAccountant
from kernel.privacy.prv_accountant import PrvAccountant
from kernel.privacy.pure_dp_optimal import PureDpOptimalAccountant
from kernel.privacy.rdp_accountant import RdpAccountant
from kernel.privacy.rdp_single_job import RdpAtDeltaAccountant

__all__ = [
    "GaussianDpAccountant",
    "PldAccountant",
    "PrvAccountant",
    "PureDpOptimalAccountant",
    "RdpAccountant",
    "RdpAtDeltaAccountant",
    "accountant",
    "accountants_for",
]


def accountant(method: str, *, zcdp_is_gaussian: bool = False) -> PrivacyAccountant:
    """A fresh accountant of the registered ``method`` (raises kernel.registry.UnknownName)."""
    return ACCOUNTANTS.get(method)(zcdp_is_gaussian=zcdp_is_gaussian)


def accountants_for(
    event: PrivacyEvent, *, zcdp_is_gaussian: bool = False, roles: frozenset[Role] = frozenset(Role)
) -> list[PrivacyAccountant]:
    """A fresh accountant of every registered method with one of ``roles`` that supports ``event``."""
    fresh = (cls(zcdp_is_gaussian=zcdp_is_gaussian) for cls in ACCOUNTANTS.values() if cls.role in roles)
    return [candidate for candidate in fresh if candidate.supports(event)]
