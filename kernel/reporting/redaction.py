"""What a report shows to whom: exact functions of the rows are the dataset owner's only, and a
chain job's ids, ε and hash are its readers' only.

The worker writes one immutable report per job, for the dataset's owner (docs/privacy-model.md §2): its
dataset block keeps the content hash, which anchors the report to the exact bytes trained on.
The hash is an exact, noise-free function of the rows, so anyone else (an analyst who submitted
the job) gets the report with the dataset named by id and name only. On a dataset with a privacy
unit column the exact row count is such a function too (it changes by the removed unit's row
count): unless the owner declared it public at upload, only the owner sees it
(docs/privacy-units.md#the-row-count).

The ``init`` section names the jobs the starting weights descend from; whoever views the report
(even the dataset's owner) sees each of them only as far as it may see that job and its dataset
(kernel/reporting/init_visibility.py), so ``init_levels`` is required of every caller.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from kernel.reporting.init_report import Level, init_for_viewer

OWNER_ONLY_DATASET_FIELDS: Final[tuple[str, ...]] = ("sha256", "size_bytes")


def report_for_viewer(
    report: dict[str, Any], *, viewer_owns_dataset: bool, init_levels: Mapping[int, Level]
) -> dict[str, Any]:
    """The report as this viewer may see it; the stored report is never modified.

    ``init_levels``: the viewer's level for each position of the report's init chain
    (:func:`kernel.reporting.init_visibility.chain_levels`); a position it lacks is shown as to a stranger."""
    shown = copy.deepcopy(report)
    if shown.get("init") is not None:
        shown["init"] = init_for_viewer(shown["init"], init_levels)
    if viewer_owns_dataset:
        return shown
    dataset = shown.get("dataset")
    if isinstance(dataset, dict):
        for field in OWNER_ONLY_DATASET_FIELDS:
            dataset.pop(field, None)
    unit_level = shown.get("unit_level")
    if isinstance(unit_level, dict) and not unit_level.get("n_rows_public", False):  # older reports: withheld
        unit_level["n_rows"] = None
        if isinstance(dataset, dict):
            dataset["n_rows"] = None
    return shown
