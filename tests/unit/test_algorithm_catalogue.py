"""The one list of algorithm families (algorithms/catalogue.py): every catalogue entry has a
trainer in its own family and every trainer an entry, every family folder is listed, and the
definitions load without torch while the worker's lookups load the trainers themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from algorithms import ALGORITHMS, get_algorithm
from algorithms.catalogue import FAMILIES, Family
from algorithms.registry import AlgorithmDefinition, register_algorithm
from algorithms.steps_charges import COMPOSED, NOT_CHARGED, PARALLEL_BLOCKS, SELF_SCHEDULED_BUDGET_UNITS, StepsCharge
from algorithms.trainers import PREFLIGHTS, get_trainer, trainer_names

REPO = Path(__file__).resolve().parents[2]


def _family_of(module: str) -> Family:
    (family,) = [family for family in FAMILIES if module.startswith(family.package + ".")]
    return family


def test_every_entry_has_a_trainer_and_every_trainer_an_entry() -> None:
    assert trainer_names() == ALGORITHMS.names()
    assert len(ALGORITHMS.names()) >= 19


def test_each_trainer_lives_in_its_entrys_family() -> None:
    for name in ALGORITHMS.names():
        entry_family = _family_of(type(get_algorithm(name)).__module__)
        trainer_family = _family_of(get_trainer(name).__module__)
        assert entry_family == trainer_family, name


def test_preflight_checks_are_for_catalogue_entries() -> None:
    trainer_names()  # loads the trainer modules, which register the checks
    assert set(PREFLIGHTS) <= set(ALGORITHMS)
    assert {"dc-dpsgd", "ht-dp-fw"} <= set(PREFLIGHTS)


def test_every_family_folder_is_listed_once_with_both_modules() -> None:
    folders = {path.parent.name for path in (REPO / "algorithms").glob("*/definition.py")}
    listed = [family.package.removeprefix("algorithms.") for family in FAMILIES]
    assert sorted(listed) == sorted(folders) and len(set(listed)) == len(listed)
    for family in FAMILIES:
        for module in (family.definition, family.trainer):
            assert (REPO / (module.replace(".", "/") + ".py")).is_file(), module


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_definitions_register_without_torch() -> None:
    out = _run(
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from algorithms import ALGORITHMS\n"
        "print(len(ALGORITHMS.names()), 'torch' in sys.modules)\n"
    )
    assert out == f"{len(ALGORITHMS.names())} False"


def test_a_preflight_before_any_trainer_lookup_still_runs_the_check() -> None:
    """The worker may check a job before it looks its trainer up: the checks load on their own."""
    out = _run(
        "from torch import nn\n"
        "from algorithms.trainers import preflight\n"
        "model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))\n"
        "try:\n"
        "    preflight('ht-dp-fw', model, None)\n"
        "except ValueError:\n"
        "    print('refused')\n"
        "else:\n"
        "    print('accepted')\n"
    )
    assert out == "refused"


def test_every_entry_declares_how_steps_enter_its_charge() -> None:
    charges = {name: get_algorithm(name).steps_charge for name in ALGORITHMS.names()}
    assert all(isinstance(charge, StepsCharge) for charge in charges.values())
    assert charges["dp-sgd"] is COMPOSED and charges["ht-dp-fw"] is PARALLEL_BLOCKS
    assert charges["kl-spider"] is SELF_SCHEDULED_BUDGET_UNITS and charges["sgd"] is NOT_CHARGED
    assert all(charge.reason for charge in charges.values() if not charge.composes)  # the estimate says why


def test_registration_refuses_an_entry_without_a_steps_charge() -> None:
    class Bare(AlgorithmDefinition[BaseModel]):
        name = "bare-steps"

    with pytest.raises(TypeError, match="steps_charge"):
        register_algorithm(Bare)
    assert "bare-steps" not in ALGORITHMS
