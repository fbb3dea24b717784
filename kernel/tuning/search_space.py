"""Which fields of a job spec a tuning may search, and the pool of configurations its trials use.

The pool is drawn before any data is read, from the search space alone, with the OS's generator:
it is public (the tuning's view lists it), and so is each configuration's cost. Each trial then
runs one configuration chosen at random, so the per-trial privacy cost is bounded by the costliest
configuration of the pool.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kernel.errors import InvalidInput
from kernel.schemas.tuning import Scalar, SearchRange

SEARCHABLE_TRAINING: Final[frozenset[str]] = frozenset(
    {"learning_rate", "batch_size", "epochs", "steps", "rows_per_unit", "ema_decay", "augmult"}
)
"""``training.*`` fields a tuning may vary (not the schedule's time limit, nor fine-tuning's choice of layers)."""
SEARCHABLE_SECTIONS: Final[tuple[str, ...]] = ("algorithm.hyperparameters.", "model.params.")
"""Prefixes under which any field may be varied (the catalogue validates each configuration)."""
INTEGER_FIELDS: Final[frozenset[str]] = frozenset(
    {"training.batch_size", "training.steps", "training.rows_per_unit", "training.augmult"}
)
"""Fields whose range values are rounded to the nearest integer."""
MAX_GRID: Final[int] = 32

Assignment = dict[str, Scalar]


def _refuse(detail: str) -> InvalidInput:
    return InvalidInput(slug="invalid-search-space", detail=detail)


def check_path(path: str) -> None:
    """A searchable dotted field, or a 422 naming what may be searched."""
    if path.startswith("training.") and path.removeprefix("training.") in SEARCHABLE_TRAINING:
        return
    if any(path.startswith(prefix) and len(path) > len(prefix) and "." not in path[len(prefix) :]
           for prefix in SEARCHABLE_SECTIONS):  # fmt: skip
        return
    fields = ", ".join(f"training.{name}" for name in sorted(SEARCHABLE_TRAINING))
    raise _refuse(
        f"search_space: {path!r} cannot be searched; searchable are {fields}, algorithm.hyperparameters.<name> and "
        "model.params.<name> (the dataset, the model, the algorithm, the privacy block and the evaluation are "
        "fixed by the base spec)"
    )


def check_space(space: Mapping[str, Sequence[Scalar] | SearchRange]) -> None:
    for path, values in space.items():
        check_path(path)
        if isinstance(values, list) and not 1 <= len(values) <= MAX_GRID:
            raise _refuse(f"search_space[{path!r}]: give 1 to {MAX_GRID} values, or a range {{low, high, log}}")


def _draw(path: str, values: Sequence[Scalar] | SearchRange, rng: random.Random) -> Scalar:
    if not isinstance(values, SearchRange):
        return rng.choice(list(values))
    if values.log:
        value = math.exp(rng.uniform(math.log(values.low), math.log(values.high)))
    else:
        value = rng.uniform(values.low, values.high)
    if path in INTEGER_FIELDS:
        return max(1, round(value))
    return float(f"{value:.6g}")  # a readable configuration; still drawn from the whole range


def candidate_pool(
    space: Mapping[str, Sequence[Scalar] | SearchRange], *, size: int, rng: random.Random
) -> list[Assignment]:
    """The configurations trials choose from: the whole grid when every field lists values and the
    grid has at most ``size`` points; otherwise ``size`` independent draws (duplicates dropped)."""
    check_space(space)
    paths = sorted(space)
    lists = [space[path] for path in paths]
    if all(not isinstance(values, SearchRange) for values in lists):
        grid = math.prod(len(values) for values in lists if not isinstance(values, SearchRange))
        if grid <= size:
            return [
                dict(zip(paths, point, strict=True))
                for point in itertools.product(*(v for v in lists if not isinstance(v, SearchRange)))
            ]
    pool: list[Assignment] = []
    for _ in range(size):
        assignment = {path: _draw(path, space[path], rng) for path in paths}
        if assignment not in pool:
            pool.append(assignment)
    return pool


def apply(base: Mapping[str, Any], assignment: Mapping[str, Scalar]) -> dict[str, Any]:
    """The base spec (JSON) with each dotted field of ``assignment`` set."""
    spec = copy.deepcopy(dict(base))
    for path, value in assignment.items():
        *parents, leaf = path.split(".")
        node = spec
        for part in parents:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise _refuse(f"search_space: {path!r} does not name a field of the base spec")
            node = child
        node[leaf] = value
        if path in _EXCLUSIVE:  # searching steps replaces the base's epochs, and the reverse
            node.pop(_EXCLUSIVE[path], None)
    return spec


_EXCLUSIVE: Final[Mapping[str, str]] = {"training.steps": "epochs", "training.epochs": "steps"}
