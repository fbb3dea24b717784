"""The one contract of every privacy accountant here, in the shape of dp-accounting's PrivacyAccountant.

An accountant is asked whether it ``supports`` an event, ``compose``s events into its state
(chainable), and answers ``epsilon(delta)`` (and, where its model has a natural inverse,
``delta(epsilon)``). Which accountant can price which event is answered by ``supports`` alone;
composing an event it does not support raises :class:`UnsupportedEvent`, the one error for that
(docs/privacy-model.md#accountants).

Accountants register themselves under their method slug (the name a report prints) with
:func:`registered`; :mod:`kernel.privacy.accounting` imports them all and hands them out.
"""

from __future__ import annotations

import enum
import math
import numbers
from abc import ABC, abstractmethod
from typing import ClassVar, Self, TypeVar

from kernel.privacy.errors import AccountantFailed, PrivacyEventError, UnsupportedEvent
from kernel.privacy.events import EVENT_TYPES, PrivacyEvent
from kernel.registry import Registry

__all__ = [
    "ACCOUNTANTS",
    "AccountantFailed",
    "PrivacyAccountant",
    "Role",
    "UnsupportedEvent",
    "epsilon_query",
    "failed",
    "registered",
]


class Role(enum.Enum):
    """What an accountant's number is for; the single-job report treats each role its own way."""

    LEDGER = "ledger"
    """The ledger's currency (RDP): valid over adaptively chosen jobs, so the budget filter uses it;
    it always answers, and its failure is the event's failure."""
    EXACT = "exact"
    """The exact privacy profile of one job: nothing can be tighter, so no numeric one is run."""
    BOUND = "bound"
    """A closed-form bound on one job, cheap and bounded in time; it may fail, then it is skipped."""
    NUMERIC = "numeric"
    """A numeric accountant for one job, unbounded in time and memory: off the request path only,
    the first that answers is kept."""


class PrivacyAccountant(ABC):
    """Composes privacy events and converts the composition to (ε, δ).

    ``zcdp_is_gaussian`` says what the event's kinds cannot: that every ρ-zCDP leaf is a Gaussian
    release (the algorithm declares it); accountants with an exact Gaussian model then support such
    leaves. False is always valid."""

    method: ClassVar[str]
    """The registry name, and the method slug a report prints."""
    role: ClassVar[Role]
    LABEL: ClassVar[str]
    """What the number is, for a report."""

    def __init__(self, *, zcdp_is_gaussian: bool = False) -> None:
        self.zcdp_is_gaussian = zcdp_is_gaussian

    def supports(self, event: PrivacyEvent) -> bool:
        """Whether :meth:`compose` would accept ``event`` now (it may depend on what is composed)."""
        return self._why_not(event) is None

    def compose(self, event: PrivacyEvent, count: int = 1) -> Self:
        """Account for ``count`` sequential runs of ``event``; returns this accountant (chainable).

        Raises :class:`UnsupportedEvent` when :meth:`supports` is False; the state is then unchanged."""
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise PrivacyEventError(f"count must be an integer >= 0, got {count!r}")
        reason = self._why_not(event)
        if reason is not None:
            raise UnsupportedEvent(accountant=self.method, event=event, reason=reason)
        if count:
            self._compose(event, int(count))
        return self

    @abstractmethod
    def epsilon(self, delta: float) -> float:
        """An upper bound on ε at ``delta`` of everything composed, rounded up (0 for nothing).

        May raise :class:`AccountantFailed` (a supported event without a trustworthy number)."""

    def delta(self, epsilon: float) -> float:
        """An upper bound on δ at ``epsilon``, rounded up, where the model has a natural inverse."""
        raise NotImplementedError(f"the {self.method} accountant answers ε at δ only")

    @property
    def label(self) -> str:
        """What :meth:`epsilon` is, for a report (may depend on what is composed)."""
        return self.LABEL

    def _why_not(self, event: object) -> str | None:
        if not isinstance(event, EVENT_TYPES):
            return "not a privacy event"
        return self._unsupported(event)  # type: ignore[arg-type]  # one of EVENT_TYPES: a PrivacyEvent

    @abstractmethod
    def _unsupported(self, event: PrivacyEvent) -> str | None:
        """Why ``event`` cannot be composed now, or None when it can."""

    @abstractmethod
    def _compose(self, event: PrivacyEvent, count: int) -> None:
        """Add ``count`` (> 0) runs of a supported ``event`` to the state."""


ACCOUNTANTS: Registry[type[PrivacyAccountant]] = Registry("privacy accountant")
"""Every accountant class by method slug, filled once at import by :func:`registered`."""

_A = TypeVar("_A", bound=PrivacyAccountant)


def registered(cls: type[_A]) -> type[_A]:
    """Class decorator: register an accountant under its ``method``."""
    ACCOUNTANTS.add(cls.method, cls)
    return cls


def failed(accountant: PrivacyAccountant, reason: str) -> AccountantFailed:
    """The error an accountant raises when it supports the events but has no trustworthy number."""
    return AccountantFailed(f"the {accountant.method} accountant has no trustworthy number: {reason}")


def epsilon_query(epsilon: float) -> float:
    """The ε a :meth:`PrivacyAccountant.delta` query is asked at: a finite number >= 0."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not 0.0 <= float(epsilon) < math.inf:
        raise PrivacyEventError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return float(epsilon)
