"""Why an upload is refused: rows the tenant registered already, deleted content that cannot come
back as it is declared, and bodies the ingest refused, as the domain errors the API answers with."""

from __future__ import annotations

from kernel.datasets.status import DatasetStatus
from kernel.db.orm import Dataset
from kernel.errors import Conflict, InvalidInput
from kernel.ingest import DatasetValidationError
from kernel.ingest.text_errors import TextValidationError

__all__ = [
    "ContentAlreadyRegistered",
    "DeletedContentWasPrivate",
    "PrivacyUnitDiffers",
    "invalid_dataset",
    "invalid_text",
]


class ContentAlreadyRegistered(Conflict):
    """The tenant already registered these rows (the same content digest): one content, one budget."""

    def __init__(self, existing: Dataset) -> None:
        deleting = existing.status == DatasetStatus.DELETING
        super().__init__(
            slug="dataset-already-registered",
            detail=(
                f"these rows are already registered as dataset {existing.id} ({existing.name!r}); a "
                "second registration would give the same rows a second budget. "
                + (
                    "That dataset is being deleted: once its deletion completes, upload them again to "
                    "continue its ledger"
                    if deleting
                    else "To spend more on them, raise that dataset's budget with "
                    f"POST /v1/datasets/{existing.id}/budget (recorded in its ledger and shown in every later "
                    f"report); to replace the upload (another label column, task or preparation), delete it "
                    f"with DELETE /v1/datasets/{existing.id} and upload again: its ledger continues"
                )
            ),
            extra={
                "existing_dataset_id": existing.id,
                "existing_status": str(existing.status),
                "links": {
                    "existing": f"/v1/datasets/{existing.id}",
                    "raise_budget": f"/v1/datasets/{existing.id}/budget",
                },
            },
        )


class DeletedContentWasPrivate(Conflict):
    """Rows whose deleted dataset had a budget cannot come back as public: that would end their ledger."""

    def __init__(self, tombstone: Dataset) -> None:
        super().__init__(
            slug="deleted-content-was-private",
            detail=(
                f"these rows were registered with a privacy budget as dataset {tombstone.id}, since deleted; its "
                "ledger records what was spent on them, so they cannot be registered again as public. Upload "
                "them with a budget (epsilon=, delta=) to continue that ledger"
            ),
            extra={"deleted_dataset_id": tombstone.id},
        )


class PrivacyUnitDiffers(Conflict):
    """A deleted dataset's ledger charged its jobs per one privacy unit; its rows come back with that unit."""

    def __init__(self, tombstone: Dataset) -> None:
        unit = tombstone.privacy_unit_column
        super().__init__(
            slug="privacy-unit-differs",
            detail=(
                f"these rows were registered as dataset {tombstone.id}, since deleted, whose ledger charged every "
                "job per "
                + (f"privacy unit {unit!r} (one unit and all its rows)" if unit else "row")
                + "; uploading them again continues that ledger, so declare the same privacy unit ("
                + (f"privacy_unit_column={unit}" if unit else "no privacy_unit_column")
                + ")"
            ),
            extra={"deleted_dataset_id": tombstone.id, "privacy_unit_column": unit},
        )


def invalid_dataset(exc: DatasetValidationError) -> InvalidInput:
    """A body or declaration the ingest refused, with its machine-readable reason."""
    return InvalidInput(slug="invalid-dataset", detail=exc.detail, extra={"reason": exc.reason})


def invalid_text(exc: TextValidationError) -> InvalidInput:
    """A text upload the ingest refused: its reason is the problem type (e.g. jsonl-invalid-line)."""
    return InvalidInput(slug=exc.reason, detail=exc.detail, extra={"reason": exc.reason})
