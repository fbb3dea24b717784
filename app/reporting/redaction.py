"""What a report shows to whom: exact functions of the rows are the dataset owner's only.

The worker writes one immutable report per job, for the dataset's owner (docs/privacy-model.md §2): its
dataset block keeps the content hash, which anchors the report to the exact bytes trained on.
The hash is an exact, noise-free function of the rows, so anyone else (an analyst who submitted
the job) gets the report with the dataset named by id and name only.
"""

from __future__ import annotations

import copy
from typing import Any, Final

OWNER_ONLY_DATASET_FIELDS: Final[tuple[str, ...]] = ("sha256", "size_bytes")


def report_for_viewer(report: dict[str, Any], *, viewer_owns_dataset: bool) -> dict[str, Any]:
    """The report as this viewer may see it; the stored report is never modified."""
    if viewer_owns_dataset:
        return report
    shown = copy.deepcopy(report)
    dataset = shown.get("dataset")
    if isinstance(dataset, dict):
        for field in OWNER_ONLY_DATASET_FIELDS:
            dataset.pop(field, None)
    return shown
