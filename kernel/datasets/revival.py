"""Re-registering content its owner deleted: the tombstone becomes the dataset again, under its old
id, and its budget and hash-chained ledger continue (one content, one budget)."""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from kernel.datasets.status import reactivate
from kernel.datasets.upload_refusals import PrivacyUnitDiffers
from kernel.datasets.upload_request import RegisteredDataset, UploadRequest
from kernel.db.orm import Dataset, PrivacyBudget
from kernel.ledger import operations as ledger
from privtrain_common.directed_rounding import format_guarantee, format_remaining

__all__ = ["REGISTRATION_COLUMNS", "revive"]

REGISTRATION_COLUMNS = (
    "name",
    "format",
    "sha256",
    "blob_key",
    "size_bytes",
    "label_column",
    "n_rows",
    "feature_shape",
    "n_features",
    "task",
    "n_classes",
    "class_names",
    "classes_declared",
    "preparation",
    "feature_names",
    "public",
    "modality",
    "array_blob_key",
    "tokenizer_id",
    "vocab_size",
    "pad_id",
    "text_field",
    "privacy_unit_column",
    "n_units",
    "idempotency_key",
    "request_hash",
    "content_digest",
)
"""What an upload declares and stores: a re-registration replaces all of it on the tombstone
(another label column, task, preparation …); id, owner, creation time, budget and ledger stay."""


def revive(
    session: Session, tombstone: Dataset, fresh: Dataset, upload: UploadRequest, *, notices: tuple[str, ...]
) -> RegisteredDataset:
    """The deleted dataset becomes ``fresh``'s registration again, under its old id: its budget
    row and hash-chained ledger continue (one content, one budget). Grants ended at the deletion
    stay ended: the owner invites again."""
    if (tombstone.privacy_unit_column or None) != (upload.privacy_unit_column or None):
        raise PrivacyUnitDiffers(tombstone)
    budget = ledger.lock_budget(session, tombstone.id)
    deleted_at = tombstone.deleted_at
    for column in REGISTRATION_COLUMNS:
        setattr(tombstone, column, getattr(fresh, column))
    reactivate(tombstone)
    session.flush()
    return RegisteredDataset(
        dataset=tombstone,
        budget=budget,
        replayed=False,
        continued=True,
        notices=(_continued_notice(tombstone, budget, upload, deleted_at=deleted_at), *notices),
    )


def _continued_notice(
    dataset: Dataset, budget: PrivacyBudget, upload: UploadRequest, *, deleted_at: dt.datetime | None
) -> str:
    when = f" on {deleted_at:%Y-%m-%d}" if deleted_at is not None else ""
    if dataset.public:
        return (
            f"these rows were registered before as this dataset ({dataset.id}) and deleted{when}; it is registered "
            "again under its old id, with its jobs. Grants ended at the deletion: invite analysts again"
        )
    summary = ledger.budget_summary(budget)
    text = (
        f"these rows were registered before as this dataset ({dataset.id}) and deleted{when}: one content, one "
        f"budget, so its ledger continues, with its budget ε_G = {format_remaining(budget.epsilon)}, "
        f"δ_G = {format_guarantee(budget.delta)} and the ε = {format_guarantee(summary['committed_epsilon'])} "
        "already spent on them. Grants ended at the deletion: invite analysts again"
    )
    if (upload.epsilon, upload.delta) != (budget.epsilon, budget.delta):
        text += (
            f". The budget given with this upload (ε = {format_guarantee(upload.epsilon)}, "
            f"δ = {format_guarantee(upload.delta)}) was not applied; raise the budget with "
            f"POST /v1/datasets/{dataset.id}/budget (recorded in the ledger)"
        )
    return text
