"""How a CSV header's columns become features under the owner's declared preparation.

Decided from the header alone, before any row is read: a declaration that names a column the file
does not have is refused without parsing the body, and the reader knows which fields to parse as
numbers, which to look up among declared categories and which never to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kernel.ingest.errors import DatasetValidationError
from kernel.ingest.limits import IngestLimits
from kernel.ingest.preparation import SCALE_ALL, Preparation, Scaling


@dataclass(frozen=True)
class OneHotColumn:
    """A text column encoded as one 0/1 feature per declared category."""

    position: int
    """The column's index in the header."""
    name: str
    categories: Mapping[str, int]
    """Each declared category and its offset within the column's features."""
    first_feature: int
    """The output feature of the first category."""


@dataclass(frozen=True)
class ScalingGroup:
    """Output features that share one declared scaling; ``features`` None means all of them."""

    features: np.ndarray | None
    scaling: Scaling


@dataclass(frozen=True)
class ColumnPlan:
    """Which header column feeds which output feature."""

    label_position: int
    unit_position: int | None
    """The privacy unit column's header index (read as an identifier, never a feature); None
    when the dataset's privacy unit is one row."""
    numeric_positions: tuple[int, ...]
    """Header indices of the columns parsed as numbers, in header order."""
    numeric_features: np.ndarray
    """The output feature each numeric column fills (int64, same length)."""
    one_hot: tuple[OneHotColumn, ...]
    feature_names: tuple[str, ...]
    """Output features in header order: dropped columns left out, one-hot columns expanded in
    place as ``column=category``."""
    scaling: tuple[ScalingGroup, ...]

    @property
    def n_features(self) -> int:
        return len(self.feature_names)


def _refuse(detail: str) -> DatasetValidationError:
    return DatasetValidationError("bad-preparation", f"preparation: {detail}")


def plan_columns(
    header: tuple[str, ...],
    *,
    label_column: str,
    preparation: Preparation | None,
    limits: IngestLimits,
    unit_column: str | None = None,
) -> ColumnPlan:
    """The plan for ``header``; refuses a declaration that does not fit it. ``unit_column`` (the
    privacy unit column) is read as each row's unit identifier and never becomes a feature."""
    preparation = preparation or Preparation()
    _check_names(header, label_column=label_column, preparation=preparation)
    _check_unit_column(header, unit_column=unit_column, label_column=label_column, preparation=preparation)
    dropped = {*preparation.drop, *((unit_column,) if unit_column is not None else ())}
    numeric_positions: list[int] = []
    numeric_features: list[int] = []
    one_hot: list[OneHotColumn] = []
    names: list[str] = []
    for position, name in enumerate(header):
        if name == label_column or name in dropped:
            continue
        categories = preparation.one_hot.get(name)
        if categories is None:
            numeric_positions.append(position)
            numeric_features.append(len(names))
            names.append(name)
            continue
        one_hot.append(
            OneHotColumn(
                position=position,
                name=name,
                first_feature=len(names),
                categories={category: i for i, category in enumerate(categories)},
            )
        )
        names.extend(f"{name}={category}" for category in categories)
    _check_features(names, limits=limits)
    return ColumnPlan(
        label_position=header.index(label_column),
        unit_position=header.index(unit_column) if unit_column is not None else None,
        numeric_positions=tuple(numeric_positions),
        numeric_features=np.array(numeric_features, dtype=np.int64),
        one_hot=tuple(one_hot),
        feature_names=tuple(names),
        scaling=_scaling_groups(
            preparation,
            names=names,
            numeric_features=numeric_features,
            numeric_names=[header[p] for p in numeric_positions],
        ),
    )


def _check_names(header: tuple[str, ...], *, label_column: str, preparation: Preparation) -> None:
    known = set(header)
    for name in preparation.named_columns:
        if name not in known:
            raise _refuse(f"column {name!r} is not among the {len(header)} header columns")
        if name == label_column:
            raise _refuse(f"column {name!r} is the label column; it cannot be dropped, one-hot encoded or scaled")


def _check_unit_column(
    header: tuple[str, ...], *, unit_column: str | None, label_column: str, preparation: Preparation
) -> None:
    """The privacy unit column must be a header column of its own: not the label, and not one the
    preparation drops, encodes or scales (it is never a feature)."""
    if unit_column is None:
        return
    if unit_column not in header:
        raise DatasetValidationError(
            "missing-privacy-unit-column",
            f"privacy_unit_column {unit_column!r} is not among the {len(header)} header columns",
        )
    if unit_column == label_column:
        raise DatasetValidationError(
            "bad-privacy-unit-column",
            f"privacy_unit_column {unit_column!r} is the label column; name the column that identifies each person",
        )
    if unit_column in preparation.named_columns:
        raise DatasetValidationError(
            "bad-privacy-unit-column",
            f"privacy_unit_column {unit_column!r} is also named in the preparation; the privacy unit column is "
            "never a feature, so leave it out of drop, one_hot and scale",
        )


def _check_features(names: list[str], *, limits: IngestLimits) -> None:
    if not names:
        raise DatasetValidationError(
            "empty-dataset", "no feature columns are left besides the label column and the dropped ones"
        )
    if len(names) > limits.max_features:
        raise DatasetValidationError(
            "too-many-columns",
            f"the prepared dataset has {len(names)} features (one-hot columns count one per "
            f"category); at most {limits.max_features} are allowed",
        )
    if len(set(names)) != len(names):
        clash = next(name for i, name in enumerate(names) if name in names[:i])
        raise _refuse(f"the one-hot feature {clash!r} has the same name as another column; rename one")


def _scaling_groups(
    preparation: Preparation, *, names: list[str], numeric_features: list[int], numeric_names: list[str]
) -> tuple[ScalingGroup, ...]:
    """Numeric features grouped by their scaling (named entries first, ``"*"`` for the rest)."""
    by_scaling: dict[Scaling, list[int]] = {}
    everything = preparation.scale.get(SCALE_ALL)
    for feature, name in zip(numeric_features, numeric_names, strict=True):
        scaling = preparation.scale.get(name, everything)
        if scaling is not None:
            by_scaling.setdefault(scaling, []).append(feature)
    all_features = len(names)
    return tuple(
        ScalingGroup(
            features=None if len(features) == all_features else np.array(features, dtype=np.int64), scaling=scaling
        )
        for scaling, features in by_scaling.items()
    )
