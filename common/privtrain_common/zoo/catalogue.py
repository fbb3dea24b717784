"""The zoo's table: every architecture a job may name, in the order the service lists them.

Torch-free and dependency-free: the service validates jobs against it, and the torch builders
(``privtrain_common.zoo.architectures``) take their names and defaults from it, so the zoo is
defined once.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from privtrain_common.zoo.cnn2 import definition as cnn2
from privtrain_common.zoo.dense import definition as dense
from privtrain_common.zoo.entry import ZooEntry
from privtrain_common.zoo.hf import definition as hf
from privtrain_common.zoo.images import definition as images
from privtrain_common.zoo.params import defaults
from privtrain_common.zoo.text import definition as text


def _by_name(entries: tuple[ZooEntry, ...]) -> Mapping[str, ZooEntry]:
    table: dict[str, ZooEntry] = {}
    for entry in entries:
        if entry.name in table:
            raise ValueError(f"model '{entry.name}' is in the zoo twice")
        table[entry.name] = entry
    return MappingProxyType(table)


CATALOGUE: Mapping[str, ZooEntry] = _by_name(
    (*dense.ENTRIES, *cnn2.ENTRIES, *images.ENTRIES, *text.ENTRIES, *hf.ENTRIES)
)
"""Name → entry; names are unique forever (released model files name their architecture)."""


def zoo_entry(name: str) -> ZooEntry:
    """The entry named ``name``; KeyError when the zoo has no such model."""
    return CATALOGUE[name]


def default_params(name: str) -> dict[str, object]:
    """The model's parameters as a job that gives none gets them."""
    return defaults(zoo_entry(name).params)
