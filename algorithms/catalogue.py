"""The algorithm families, one line each: the module of its catalogue entries and of its trainers.

A family is a folder under algorithms/: ``definition.py`` holds its torch-free catalogue entries
(classes decorated with ``@register_algorithm``), which the API prices jobs with, and
``trainer.py`` a trainer for each (``@register_trainer(Entry)``), which only the worker imports.
Adding a family is that folder and one line in `FAMILIES`; adding an algorithm to a family
touches its folder only. The modules are named here, not imported, so that the API loads the
definitions without torch and the worker loads the trainers on its first lookup
(tests/unit/test_algorithm_catalogue.py checks that every entry has a trainer and vice versa).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["FAMILIES", "Family", "load_definitions", "load_trainers"]


@dataclass(frozen=True)
class Family:
    """One folder under algorithms/, by the modules whose imports register its entries."""

    definition: str
    """Registers the family's catalogue entries; torch-free (the API imports it)."""
    trainer: str
    """Registers a trainer (and any preflight check) for each of those entries; torch."""

    @property
    def package(self) -> str:
        """The family's folder as a package name, e.g. ``algorithms.dp_sgd``."""
        return self.definition.rpartition(".")[0]


# In the catalogue's listing order (GET /v1/algorithms lists the entries as they register).
FAMILIES: tuple[Family, ...] = (
    Family(definition="algorithms.baselines.definition", trainer="algorithms.baselines.trainer"),
    Family(definition="algorithms.dc_dpsgd.definition", trainer="algorithms.dc_dpsgd.trainer"),
    Family(definition="algorithms.dicesgd.definition", trainer="algorithms.dicesgd.trainer"),
    Family(definition="algorithms.dp_sgd.definition", trainer="algorithms.dp_sgd.trainer"),
    Family(definition="algorithms.ht_dpsco.definition", trainer="algorithms.ht_dpsco.trainer"),
    Family(definition="algorithms.kl_family.definition", trainer="algorithms.kl_family.trainer"),
    Family(definition="algorithms.non_private.definition", trainer="algorithms.non_private.trainer"),
)


def load_definitions() -> None:
    """Register every family's catalogue entries (idempotent: a module is imported once)."""
    for family in FAMILIES:
        importlib.import_module(family.definition)


def load_trainers() -> None:
    """Register every family's trainers (idempotent); imports torch."""
    for family in FAMILIES:
        importlib.import_module(family.trainer)
