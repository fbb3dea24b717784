"""The report's statement of what one privacy unit is, and how much one unit could contribute."""

from __future__ import annotations

from typing import Any

from kernel.datasets.facts import privacy_unit_text
from kernel.db.orm import Dataset


def privacy_unit_section(dataset: Dataset, training: dict[str, Any]) -> dict[str, Any]:
    """The privacy unit, the neighbouring relation, the number of units and the contribution bound.

    A dataset with a privacy unit column protects one unit (e.g. a patient) and all its rows: the
    job sampled units, and each sampled unit's gradient was the mean of ``rows_per_unit`` of its
    rows, mapped (clipped) as one vector, so one unit moved each step's sum by at most the
    sensitivity, however many rows it has."""
    unit = privacy_unit_text(dataset.privacy_unit_column)
    if dataset.privacy_unit_column is None:
        return {
            "privacy_unit": "one row of the uploaded dataset",
            "neighbouring_relation": "add/remove one row",
            "guarantee_unit": "one row",
        }
    rows_per_unit = training.get("rows_per_unit")
    return {
        "privacy_unit": unit,
        "neighbouring_relation": f"add/remove one {dataset.privacy_unit_column} together with all its rows",
        "guarantee_unit": f"one {dataset.privacy_unit_column} (all of their rows together)",
        "unit_level": {
            "privacy_unit_column": dataset.privacy_unit_column,
            "n_units": dataset.n_units,
            "n_rows": dataset.n_rows,  # the owner's copy; redaction withholds it unless declared public
            "n_rows_public": dataset.n_rows_public,
            "sampling": "Poisson over units: each unit is in a step's batch independently with probability q",
            "rows_per_unit": rows_per_unit,
            "contribution_bound": (
                f"each sampled unit contributes the mean of {rows_per_unit} of its rows' gradients (drawn at "
                "random by the worker; all of its rows, repeated evenly, when it has fewer), mapped as one "
                "vector: one unit moves a step's sum by at most the sensitivity, whatever its number of rows"
            ),
        },
    }


def row_count_caveat(dataset: Dataset) -> str | None:
    """On a dataset with a privacy unit column, what the exact row count would reveal, and who sees it."""
    if dataset.privacy_unit_column is None:
        return None
    unit = dataset.privacy_unit_column
    implication = (
        f"The exact row count n_rows is an exact function of the rows: removing one {unit} changes it by that "
        f"{unit}'s number of rows, so whoever knows every other {unit}'s rows learns from it how many rows the "
        f"remaining {unit} has, and this guarantee does not cover that."
    )
    if dataset.n_rows_public:
        return f"{implication} The owner declared it public at upload, so it is shown to everyone with access."
    return (
        f"{implication} It is shown to the owner only; everyone else sees the number of units (n_units), from "
        "which every public quantity of a job here is computed (sampling rates, batch and hold-out sizes, "
        "normalisation)."
    )
