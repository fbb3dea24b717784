"""The owner's declared data preparation: columns to drop, one-hot categories, feature scaling.

Why declared: a transform computed from the rows (a column's mean or range, the categories that
occur in it) is an exact function of them and would leak through the model and the public schema
(docs/privacy-model.md §2). A transform the owner declares at upload is independent of the rows:
it is public, shown with the dataset and in every report. Applying it (clipping included) is a
fixed public map of each row on its own: neighbouring datasets stay neighbouring, so the DP
guarantee for the prepared rows holds for the uploaded ones and the preparation costs no privacy.

The declaration is one JSON object, e.g.
``{"drop": ["patient_id"], "one_hot": {"sex": ["female", "male"]},
"scale": {"age": {"bounds": [0, 120]}, "*": {"center": 0, "scale": 10}}}``; ``"labels": "indices"``
declares the labels to be indices into a declared class list (by default they match it by name).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernel.bounded_json import JsonBounds, JsonRefused, loads_bounded
from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.limits import IngestLimits

MAX_PREPARATION_CHARS = 16_000
_DECLARATION_BOUNDS = JsonBounds(max_chars=MAX_PREPARATION_CHARS, max_depth=16)
"""A declaration nests 4 levels deep ({"scale": {"age": {"bounds": [0, 120]}}}); 16 is ample."""
"""Characters of the declaration as sent (a query parameter: URLs much longer fail elsewhere).
Wide datasets scale with ``"*"`` rather than one entry per column."""
MAX_CATEGORIES = 1_000
"""Categories one one-hot column may declare."""
SCALE_ALL = "*"
"""The ``scale`` key that applies to every numeric feature not named on its own."""
TARGET_RANGES: tuple[tuple[float, float], ...] = ((0.0, 1.0), (-1.0, 1.0))
"""Where ``bounds`` may map a feature: min-max scaling to [0, 1] or [-1, 1]."""


@dataclass(frozen=True)
class MinMax:
    """Public bounds [low, high]: values are clipped to them, then mapped linearly onto ``target``."""

    low: float
    high: float
    target: tuple[float, float] = (0.0, 1.0)

    def to_json(self) -> dict[str, Any]:
        return {"bounds": [self.low, self.high], "range": list(self.target)}


@dataclass(frozen=True)
class Standardise:
    """Public location and scale: ``(x - center) / scale``, not clipped."""

    center: float
    scale: float

    def to_json(self) -> dict[str, Any]:
        return {"center": self.center, "scale": self.scale}


Scaling = MinMax | Standardise


@dataclass(frozen=True)
class Preparation:
    """A validated declaration. Column names are the CSV header's; only ``scale["*"]`` applies
    to array formats (NPZ), whose features have no names."""

    drop: tuple[str, ...] = ()
    one_hot: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scale: Mapping[str, Scaling] = field(default_factory=dict)
    labels_are_indices: bool = False
    """``"labels": "indices"``: label i is the i-th name of the declared class list, for lists whose
    names are numbers (by default labels are matched to the list by name)."""

    @property
    def named_columns(self) -> tuple[str, ...]:
        """Every header column the declaration names (``"*"`` is not a column)."""
        return (*self.drop, *self.one_hot, *(name for name in self.scale if name != SCALE_ALL))

    def to_json(self) -> dict[str, Any]:
        """The canonical form stored with the dataset, shown to its readers and hashed for
        idempotency; :func:`preparation_from_json` reads it back."""
        declared: dict[str, Any] = {}
        if self.drop:
            declared["drop"] = list(self.drop)
        if self.one_hot:
            declared["one_hot"] = {name: list(categories) for name, categories in self.one_hot.items()}
        if self.scale:
            declared["scale"] = {name: scaling.to_json() for name, scaling in self.scale.items()}
        if self.labels_are_indices:
            declared["labels"] = "indices"
        return declared


def _refuse(detail: str) -> DatasetValidationError:
    return DatasetValidationError("bad-preparation", f"preparation: {detail}")


def parse_preparation(raw: str | None, *, limits: IngestLimits) -> Preparation | None:
    """The owner's JSON declaration, strictly validated; None when nothing is declared.

    Column names are checked against the header later, when the file is read.
    """
    if raw is None:
        return None
    if len(raw) > MAX_PREPARATION_CHARS:
        raise _refuse(
            f"the declaration has {len(raw)} characters; at most {MAX_PREPARATION_CHARS} are "
            'allowed (scale every feature at once with "*")'
        )
    try:
        document = loads_bounded(raw, bounds=_DECLARATION_BOUNDS)
    except JsonRefused as exc:
        if exc.reason == "non-finite-number":
            raise _refuse(
                "NaN, Infinity and numbers beyond float64 are not allowed; every number must be finite"
            ) from None
        raise _refuse(exc.detail) from None
    return preparation_from_json(document, limits=limits)


def preparation_from_json(document: object, *, limits: IngestLimits) -> Preparation | None:
    """Validate a decoded declaration (from the request, or as stored with a dataset)."""
    if document is None:
        return None
    if not isinstance(document, dict):
        raise _refuse('it must be a JSON object such as {"drop": ["id"]}')
    unknown = sorted(set(document) - set(_SECTIONS))
    if unknown:
        raise _refuse(f"unknown key {unknown[0]!r}; the keys are {', '.join(_SECTIONS)}")
    sections = {key: _SECTIONS[key](document[key], limits) for key in _SECTIONS if key in document}
    preparation = Preparation(
        drop=sections.get("drop", ()),
        one_hot=sections.get("one_hot", {}),
        scale=sections.get("scale", {}),
        labels_are_indices=sections.get("labels", False),
    )
    _check_each_column_once(preparation)
    if not preparation.to_json():
        return None
    return preparation


def _column_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _refuse(f"{where} must be a non-empty column name (a string)")
    return value


def _parse_drop(value: object, limits: IngestLimits) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _refuse('drop must be a list of column names, e.g. ["patient_id"]')
    if len(value) > limits.max_features:
        raise _refuse(f"drop names {len(value)} columns; at most {limits.max_features}")
    names = tuple(_column_name(name, f"drop[{i}]") for i, name in enumerate(value))
    if len(set(names)) != len(names):
        raise _refuse("drop names a column twice")
    return names


def _category(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or value != value.strip():
        raise _refuse(f"{where} must be a non-empty string without leading or trailing spaces")
    if any(unicodedata.category(ch).startswith("C") for ch in value):
        raise _refuse(f"{where} must not contain control characters")
    return value


def _parse_one_hot(value: object, limits: IngestLimits) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise _refuse('one_hot must map column names to their categories, e.g. {"sex": ["female", "male"]}')
    columns: dict[str, tuple[str, ...]] = {}
    total = 0
    for name, categories in value.items():
        _column_name(name, "a one_hot key")
        if not isinstance(categories, list) or not 1 <= len(categories) <= MAX_CATEGORIES:
            raise _refuse(f"one_hot[{name!r}] must be a list of 1 to {MAX_CATEGORIES} categories")
        parsed = tuple(_category(c, f"one_hot[{name!r}][{i}]") for i, c in enumerate(categories))
        if len(set(parsed)) != len(parsed):
            raise _refuse(f"one_hot[{name!r}] lists a category twice")
        total += len(parsed)
        columns[name] = parsed
    if total > limits.max_features:
        raise _refuse(f"one_hot declares {total} categories in all; at most {limits.max_features}")
    return columns


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(f"{where} must be a number")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float's range
        number = math.inf
    if not math.isfinite(number):
        raise _refuse(f"{where} must be a finite number")
    return number


def _pair(value: object, where: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise _refuse(f"{where} must be a list of two numbers [low, high]")
    return _number(value[0], f"{where}[0]"), _number(value[1], f"{where}[1]")


def _min_max(scaling: dict[str, Any], where: str) -> MinMax:
    low, high = _pair(scaling["bounds"], f"{where}.bounds")
    if not low < high or not math.isfinite(high - low):
        raise _refuse(f"{where}.bounds must have low < high (and a finite width)")
    target = _pair(scaling.get("range", [0, 1]), f"{where}.range")
    if target not in TARGET_RANGES:
        raise _refuse(f"{where}.range must be [0, 1] or [-1, 1]")
    return MinMax(low=low, high=high, target=target)


def _standardise(scaling: dict[str, Any], where: str) -> Standardise:
    if "scale" not in scaling:
        raise _refuse(f"{where} needs both center and scale")
    scale = _number(scaling["scale"], f"{where}.scale")
    if scale <= 0:
        raise _refuse(f"{where}.scale must be positive")
    return Standardise(center=_number(scaling["center"], f"{where}.center"), scale=scale)


@dataclass(frozen=True)
class _ScalingKind:
    keys: frozenset[str]
    parse: Callable[[dict[str, Any], str], Scaling]


_SCALING_KINDS: dict[str, _ScalingKind] = {
    "bounds": _ScalingKind(frozenset({"bounds", "range"}), _min_max),
    "center": _ScalingKind(frozenset({"center", "scale"}), _standardise),
}
"""A scaling's kind is named by its first key: {"bounds": ...} or {"center": ..., "scale": ...}."""


def _scaling(value: object, where: str) -> Scaling:
    forms = '{"bounds": [low, high]} (optionally with "range": [-1, 1]) or {"center": c, "scale": s}'
    kinds = [kind for marker, kind in _SCALING_KINDS.items() if isinstance(value, dict) and marker in value]
    if len(kinds) != 1:
        raise _refuse(f"{where} must be {forms}")
    assert isinstance(value, dict)
    (kind,) = kinds
    extra = sorted(set(value) - kind.keys)
    if extra:
        raise _refuse(f"{where} has unknown key {extra[0]!r}; it must be {forms}")
    return kind.parse(value, where)


def _parse_scale(value: object, limits: IngestLimits) -> dict[str, Scaling]:
    if not isinstance(value, dict):
        raise _refuse('scale must map column names (or "*" for all) to a scaling, e.g. {"age": {"bounds": [0, 120]}}')
    if len(value) > limits.max_features + 1:
        raise _refuse(f"scale names {len(value)} columns; at most {limits.max_features}")
    return {_column_name(name, "a scale key"): _scaling(spec, f"scale[{name!r}]") for name, spec in value.items()}


def _parse_labels(value: object, limits: IngestLimits) -> bool:
    del limits  # no size to bound
    if value not in LABEL_MATCHING:
        raise _refuse(
            'labels must be "names" (the default: labels are matched to the declared class '
            'list by name) or "indices" (label i is the i-th declared name)'
        )
    return value == "indices"


LABEL_MATCHING = ("names", "indices")

_SECTIONS: dict[str, Callable[[object, IngestLimits], Any]] = {
    "drop": _parse_drop,
    "one_hot": _parse_one_hot,
    "scale": _parse_scale,
    "labels": _parse_labels,
}


def _check_each_column_once(preparation: Preparation) -> None:
    seen: set[str] = set()
    for name in preparation.named_columns:
        if name in seen:
            raise _refuse(f"column {name!r} appears in more than one of drop, one_hot and scale")
        seen.add(name)


def check_preparation_for_format(preparation: Preparation | None, *, has_column_names: bool) -> None:
    """Array formats have no column names: only ``scale["*"]`` can apply to them."""
    if preparation is None or has_column_names:
        return
    if preparation.named_columns:
        raise _refuse(
            'this format has no column names, so only scale["*"] applies; drop, one_hot '
            "and named scale entries need a CSV header"
        )


def preparation_report(stored: Mapping[str, Any] | None) -> dict[str, Any]:
    """The report's "preparation" block: what the worker applied to the rows before training."""
    if not stored:
        return {
            "declared": False,
            "applied": "none: the features were used as uploaded",
        }
    return {
        "declared": True,
        **{key: stored[key] for key in _SECTIONS if key in stored},
        "applied": (
            "declared public by the owner at upload and applied by the worker to every row when it "
            "loaded the data: dropped columns were never parsed or used, one-hot columns became one 0/1 feature "
            "per declared category, bounds scaled and clipped the values to their range, center/scale "
            "standardised them"
        ),
        "privacy": (
            "the declaration does not depend on the rows, so it is public; it maps each row on its "
            "own (clipping included), so neighbouring datasets stay neighbouring and it costs no privacy"
        ),
    }
