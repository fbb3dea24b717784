"""The shared state of the single-job accountants that price a job by its mechanisms: each
distinct one-use mechanism with its total number of uses.

Composition is flat (the order of independent mechanisms does not change a privacy-loss
distribution), so equal mechanisms are merged and their counts summed: composing an event k times
is exactly composing it once with k times its counts, and a leaf used 0 times is no mechanism at
all (it is neither priced nor asked to be supported). A hyperparameter tuning is not a composition
of known mechanisms (its cost is known only as an RDP curve), so none of these support it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import replace

from kernel.privacy.accountant import PrivacyAccountant
from kernel.privacy.events import LeafEvent, PrivacyEvent, contains_tuning, iter_leaves


def aggregate_leaves(leaves: Iterable[LeafEvent]) -> tuple[LeafEvent, ...]:
    """Leaves with equal one-use mechanisms merged (counts summed), in first-seen order; zero counts dropped."""
    return LeafCounts().add(leaves, times=1).leaves


class LeafCounts:
    """Each distinct one-use mechanism and its total uses, in first-seen order."""

    def __init__(self) -> None:
        self._counts: dict[LeafEvent, int] = {}

    def add(self, leaves: Iterable[LeafEvent], *, times: int) -> LeafCounts:
        for leaf in leaves:
            if leaf.count > 0:
                one_use = replace(leaf, count=1)
                self._counts[one_use] = self._counts.get(one_use, 0) + leaf.count * times
        return self

    @property
    def leaves(self) -> tuple[LeafEvent, ...]:
        return tuple(replace(leaf, count=count) for leaf, count in self._counts.items())


class LeafAccountant(PrivacyAccountant):
    """An accountant whose state is the multiset of mechanisms composed so far."""

    def __init__(self, *, zcdp_is_gaussian: bool = False) -> None:
        super().__init__(zcdp_is_gaussian=zcdp_is_gaussian)
        self._counts = LeafCounts()

    @property
    def leaves(self) -> tuple[LeafEvent, ...]:
        """Every distinct mechanism composed, with its total count (as :func:`aggregate_leaves`)."""
        return self._counts.leaves

    def _unsupported(self, event: PrivacyEvent) -> str | None:
        if contains_tuning(event):
            return "a hyperparameter tuning is known only by its RDP curve"
        used = [leaf for leaf in iter_leaves(event) if leaf.count > 0]
        for leaf in used:
            reason = self._leaf_unsupported(leaf)
            if reason is not None:
                return reason
        return self._leaves_unsupported(used)

    def _compose(self, event: PrivacyEvent, count: int) -> None:
        self._counts.add(iter_leaves(event), times=count)

    @abstractmethod
    def _leaf_unsupported(self, leaf: LeafEvent) -> str | None:
        """Why this mechanism (used at least once) is outside the accountant's model, or None."""

    def _leaves_unsupported(self, used: list[LeafEvent]) -> str | None:
        """Why these mechanisms together with those composed are outside the model (default: never)."""
        return None
