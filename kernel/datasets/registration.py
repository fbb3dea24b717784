"""Registering a received upload as a dataset with its own privacy budget.

The route (``POST /v1/datasets``) parses the parameters and streams the body into a pending
blob; everything after that is here: hash, replay an idempotent retry, parse and validate the
rows, compute their content digest (kernel/datasets/content_identity.py), and in one transaction either refuse
content the tenant already registered (one content, one budget: docs/privacy-model.md §3), or
continue the ledger of the same content that its owner deleted (the tombstone becomes the dataset
again), or register a new dataset and open its ledger. Blocking work: the route runs it in a
worker thread. Refusals are domain errors (kernel/errors.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session

from kernel.datasets.content_identity import ContentUnreadable, content_digest
from kernel.datasets.image_arrays import StagedArray, stage_image_array
from kernel.datasets.status import DatasetStatus, reactivate
from kernel.datasets.text_arrays import stage_token_array
from kernel.db.engine import Database
from kernel.db.idempotency import IdempotentRequest, create_once, earlier
from kernel.db.orm import Dataset, PrivacyBudget, Tenant
from kernel.errors import Conflict, InvalidInput
from kernel.ingest import (
    DatasetValidationError,
    ImageOptions,
    IngestFacts,
    IngestLimits,
    Modality,
    Preparation,
    dataset_facts,
    image_facts,
    parse_dataset,
    parse_images,
    resolve_modality,
)
from kernel.ingest.text import TEXT_FORMATS, TextFacts, TextOptions, check_text_options, scan_text, write_token_rows
from kernel.ingest.text_errors import TextValidationError
from kernel.ledger import operations as ledger
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.storage.references import discard_unreferenced_blob, lock_blob_key
from kernel.tokenizers.registry import LoadedTokenizer, load_for_upload
from privtrain_common.directed_rounding import format_guarantee, format_remaining

__all__ = [
    "ContentAlreadyRegistered",
    "DeletedContentWasPrivate",
    "PrivacyUnitDiffers",
    "RegisteredDataset",
    "UploadRequest",
    "invalid_dataset",
    "register_upload",
]

log = logging.getLogger("privtrain.datasets")


@dataclass(frozen=True)
class UploadRequest:
    """What an upload asked for, besides its body."""

    name: str
    fmt: str
    epsilon: float
    delta: float
    label_column: str | None
    task: str | None
    class_list: tuple[str, ...] | None
    idempotency_key: str | None
    preparation: Preparation | None = None
    public: bool = False
    """Declared public by its owner: no budget (epsilon/delta are 0 and unused), no ledger."""
    modality: str | None = None
    """"image" or "tabular" as declared; None: decided from the format and the NPZ's X dtype."""
    image_options: ImageOptions = field(default_factory=ImageOptions)
    text_options: TextOptions | None = None
    """A text (JSON Lines) upload's tokenizer, max_length and member names; None for other formats."""
    privacy_unit_column: str | None = None
    """The CSV column naming each row's privacy unit (user-level privacy); None: one row."""
    n_rows_public: bool = False
    """With a privacy unit column: the owner declares the exact row count public (docs/privacy-units.md)."""


@dataclass(frozen=True)
class RegisteredDataset:
    """The dataset and its budget (loaded, detached); ``replayed`` when an earlier upload with the
    same key registered it, ``continued`` when the upload re-registered content its owner had
    deleted (the old ledger goes on), ``notices`` what the owner should know."""

    dataset: Dataset
    budget: PrivacyBudget
    replayed: bool
    notices: tuple[str, ...] = ()
    continued: bool = False


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


def upload_hash(
    *,
    sha256: str,
    name: str,
    fmt: str,
    epsilon: float,
    delta: float,
    label_column: str | None,
    task: str | None,
    classes: tuple[str, ...] | None,
    preparation: Preparation | None = None,
    public: bool = False,
    modality: str | None = None,
    image_options: ImageOptions | None = None,
    text_options: TextOptions | None = None,
    privacy_unit_column: str | None = None,
    n_rows_public: bool = False,
) -> str:
    """What an upload asked for: its body's digest and every parameter."""
    request: dict[str, object] = {
        "sha256": sha256,
        "name": name,
        "format": fmt,
        "epsilon": epsilon,
        "delta": delta,
        "label_column": label_column,
        "task": task,
    }
    if classes is not None:  # absent from digests made before class lists existed
        request["classes"] = list(classes)
    if preparation is not None:  # absent from digests made before preparations existed
        request["preparation"] = preparation.to_json()
    if public:  # absent from digests made before public datasets existed
        request["public"] = True
    if modality is not None:  # absent from digests made before image datasets existed
        request["modality"] = modality
    if image_options is not None and image_options.to_json():
        request["image"] = image_options.to_json()
    if text_options is not None:  # absent from digests made before text datasets existed
        request["text"] = text_options.to_json()
    if privacy_unit_column is not None:  # absent from digests made before privacy units existed
        request["privacy_unit_column"] = privacy_unit_column
    if n_rows_public:  # absent from digests made before the row count could be withheld
        request["n_rows_public"] = True
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def _replayed(session: Session, dataset: Dataset) -> RegisteredDataset:
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    return RegisteredDataset(dataset=dataset, budget=budget, replayed=True)


def _earlier_upload(db: Database, request: IdempotentRequest) -> RegisteredDataset | None:
    with db.read_session() as session:
        dataset = earlier(session, Dataset, request)
        return _replayed(session, dataset) if dataset is not None else None


def _registered_with_bytes(session: Session, tenant_id: str, sha256: str) -> Dataset | None:
    """A live (not deleted) dataset of the tenant uploaded as these very bytes."""
    return session.scalar(
        select(Dataset)
        .where(Dataset.tenant_id == tenant_id, Dataset.sha256 == sha256, Dataset.status != DatasetStatus.DELETED)
        .order_by(Dataset.created_at, Dataset.id)
        .limit(1)
    )


def _refuse_known_content(db: Database, tenant_id: str, sha256: str) -> None:
    """Early, cheap check before parsing (the same bytes are the same rows); the binding check, by
    content digest, runs again under the tenant lock."""
    with db.read_session() as session:
        existing = _registered_with_bytes(session, tenant_id, sha256)
        if existing is not None:
            raise ContentAlreadyRegistered(existing)


def same_content(tenant_id: str, *, digest: str, sha256: str) -> ColumnElement[bool]:
    """SQL filter: the tenant's datasets with this content. Datasets registered before the digest
    existed (``content_digest`` NULL, until backfilled) are recognised by their bytes' SHA-256."""
    return and_(
        Dataset.tenant_id == tenant_id,
        or_(Dataset.content_digest == digest, and_(Dataset.content_digest.is_(None), Dataset.sha256 == sha256)),
    )


@dataclass(frozen=True)
class _Match:
    live: Dataset | None
    """Registered (active, or still being deleted): the upload is refused."""
    tombstone: Dataset | None
    """Deleted, of the same kind (private or public) as the upload: its ledger continues."""


def _match_content(session: Session, tenant_id: str, *, digest: str, sha256: str, public: bool) -> _Match:
    matches = list(
        session.scalars(
            select(Dataset)
            .where(same_content(tenant_id, digest=digest, sha256=sha256))
            .order_by(Dataset.created_at, Dataset.id)
        )
    )
    live = next((d for d in matches if d.status != DatasetStatus.DELETED), None)
    deleted = [d for d in matches if d.status == DatasetStatus.DELETED]
    if public and any(not d.public for d in deleted):
        raise DeletedContentWasPrivate(next(d for d in deleted if not d.public))
    # A private upload of rows once declared public starts a budget of its own: nothing was promised.
    return _Match(live=live, tombstone=next((d for d in deleted if d.public == public), None))


def _inferred_task_notice(task: str) -> str:
    return (
        f"no task was given, so it was inferred from the labels ({task}) and is now public. Give "
        "task= at upload to make it independent of the rows."
    )


def _observed_classes_notice(names: tuple[str, ...]) -> str:
    n_classes = len(names)
    found = (
        f"the {n_classes} labels found (0 to {n_classes - 1})"
        if names == tuple(str(i) for i in range(n_classes))
        else f"the {n_classes} distinct labels found, sorted (a label's class is its position in the list),"
    )
    return (
        f"no class list was declared, so {found} became "
        "this dataset's public class list: everyone who may read the dataset sees it. Declare the "
        "list at upload (classes=name0,name1,...) to make it independent of the rows."
    )


@dataclass(frozen=True)
class _Validated:
    """A parsed body's public facts, and the blob it was stored as."""

    sha256: str
    digest: str
    """The content digest of the parsed rows (kernel/datasets/content_identity.py)."""
    key: str
    created: bool
    facts: IngestFacts | TextFacts
    feature_names: list[str] | None
    class_names: tuple[str, ...] | None
    modality: Modality | Literal["text"] = "tabular"
    array: StagedArray | None = None
    """An image dataset's decoded uint8 array, or a text dataset's token ids, stored as its own blob."""
    text: _TextColumns | None = None


@dataclass(frozen=True)
class _TextColumns:
    """A text dataset's public declarations, as stored with it."""

    tokenizer_id: str
    vocab_size: int
    pad_id: int
    text_field: str
    label_field: str | None
    """None for a language-modelling dataset (its records have no label)."""


def _new_dataset(
    tenant_id: str, upload: UploadRequest, body: _Validated, *, size_bytes: int, request_hash: str
) -> Dataset:
    facts, class_names = body.facts, body.class_names
    return Dataset(
        tenant_id=tenant_id,
        name=upload.name,
        format=upload.fmt,
        sha256=body.sha256,
        blob_key=body.key,
        size_bytes=size_bytes,
        label_column=body.text.label_field if body.text is not None else upload.label_column,
        n_rows=int(facts["n_rows"]),
        feature_shape=[int(v) for v in facts["feature_shape"]],
        n_features=int(facts["n_features"]),
        task=str(facts["task"]),
        n_classes=len(class_names) if class_names is not None else None,
        class_names=list(class_names) if class_names is not None else None,
        classes_declared=upload.class_list is not None,
        preparation=upload.preparation.to_json() if upload.preparation is not None else None,
        feature_names=body.feature_names,
        public=upload.public,
        modality=body.modality,
        array_blob_key=body.array.key if body.array is not None else None,
        tokenizer_id=body.text.tokenizer_id if body.text is not None else None,
        vocab_size=body.text.vocab_size if body.text is not None else None,
        pad_id=body.text.pad_id if body.text is not None else None,
        text_field=body.text.text_field if body.text is not None else None,
        privacy_unit_column=upload.privacy_unit_column,
        n_units=facts.get("n_units"),
        n_rows_public=upload.privacy_unit_column is None or upload.n_rows_public,
        idempotency_key=upload.idempotency_key,
        request_hash=request_hash if upload.idempotency_key else None,
    )


def _notices(upload: UploadRequest, body: _Validated) -> tuple[str, ...]:
    notices = (
        []
        if upload.class_list is not None or body.class_names is None
        else [_observed_classes_notice(body.class_names)]
    )
    if upload.task is None and upload.class_list is None and upload.fmt not in ("zip", *TEXT_FORMATS):
        # a ZIP is classification; a text dataset's task follows from its records' members, not their values
        notices.insert(0, _inferred_task_notice(str(body.facts["task"])))
    return tuple(notices)


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


def _revive(
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


def _register(
    db: Database,
    *,
    tenant_id: str,
    upload: UploadRequest,
    body: _Validated,
    size_bytes: int,
    request_hash: str,
) -> RegisteredDataset:
    """One registration per content and tenant: serialised on the tenant row, so two concurrent
    uploads of the same rows cannot both pass the check."""
    with db.write_transaction() as session:
        session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())
        lock_blob_key(session, body.key)  # a failed upload's clean-up cannot race this row
        if body.array is not None:
            lock_blob_key(session, body.array.key)
        match = _match_content(session, tenant_id, digest=body.digest, sha256=body.sha256, public=upload.public)
        if match.live is not None:
            raise ContentAlreadyRegistered(match.live)
        dataset = _new_dataset(tenant_id, upload, body, size_bytes=size_bytes, request_hash=request_hash)
        dataset.content_digest = body.digest
        if match.tombstone is not None:
            return _revive(session, match.tombstone, dataset, upload, notices=_notices(upload, body))
        session.add(dataset)
        session.flush()
        # A public dataset's budget row is only the lock its jobs' transitions take: it holds
        # ε = δ = 0, and no ledger entry is ever written to it (kernel.jobs.lifecycle).
        budget = ledger.open_budget(session, dataset=dataset, epsilon=upload.epsilon, delta=upload.delta)
        session.flush()
    return RegisteredDataset(dataset=dataset, budget=budget, replayed=False, notices=_notices(upload, body))


def register_upload(
    *,
    db: Database,
    blobs: BlobStore,
    tenant_id: str,
    pending: PendingBlob,
    limits: IngestLimits,
    upload: UploadRequest,
) -> RegisteredDataset:
    """Validate a received body and register it with its budget (blocking: run it in a thread).

    With an idempotency key, a retried upload (same key, same body and parameters) gets the
    dataset the first one registered, never a second dataset with its own budget; a key used for
    a different upload is refused. Rows the tenant already registered otherwise are refused
    (:class:`ContentAlreadyRegistered`); rows of a dataset the tenant deleted continue its ledger
    (``continued``). The pending blob is always discarded.
    """
    try:
        sha256 = pending.finish()
        request = IdempotentRequest(
            tenant_id=tenant_id,
            key=upload.idempotency_key,
            what="upload",
            request_hash=upload_hash(
                sha256=sha256,
                name=upload.name,
                fmt=upload.fmt,
                epsilon=upload.epsilon,
                delta=upload.delta,
                label_column=upload.label_column,
                task=upload.task,
                classes=upload.class_list,
                preparation=upload.preparation,
                public=upload.public,
                modality=upload.modality,
                image_options=upload.image_options,
                text_options=upload.text_options,
                privacy_unit_column=upload.privacy_unit_column,
                n_rows_public=upload.n_rows_public,
            ),
        )
        replay = _earlier_upload(db, request)
        if replay is not None:
            pending.discard()
            return replay
        _refuse_known_content(db, tenant_id, sha256)
        tokenizer = (
            load_for_upload(db, blobs, tenant_id=tenant_id, tokenizer_id=upload.text_options.tokenizer)
            if upload.text_options is not None
            else None
        )
        body = _validate(blobs, pending, sha256=sha256, upload=upload, limits=limits, tokenizer=tokenizer)
    except BaseException:
        pending.discard()
        raise
    registered = False
    try:
        result = create_once(
            db,
            Dataset,
            request,
            create=lambda: _register(
                db,
                tenant_id=tenant_id,
                upload=upload,
                body=body,
                size_bytes=pending.size,
                request_hash=request.request_hash,
            ),
            replay=_replayed,
            lost_race=(ContentAlreadyRegistered,),  # a concurrent retry with the same key won
        )
        registered = not result.replayed
        if registered and not body.created:
            # the blob was another upload's: restore it if that one failed and removed it
            blobs.adopt(pending.path, sha256)
        if registered and body.array is not None and not body.array.created:
            blobs.adopt(body.array.pending.path, body.array.sha256)
    finally:
        if body.created and not registered:
            discard_unreferenced_blob(db, blobs, key=body.key)
        if body.array is not None:
            if body.array.created and not registered:
                discard_unreferenced_blob(db, blobs, key=body.array.key)
            body.array.pending.discard()
        pending.discard()
    if registered:
        log.info(
            "dataset registered again, its ledger continued" if result.continued else "dataset registered",
            extra={"dataset_id": result.dataset.id, "tenant_id": tenant_id},
        )
    return result


def _digest_of(pending: PendingBlob, *, fmt: str, limits: IngestLimits) -> str:
    """The content digest of a validated upload, read before it is adopted as its blob (the
    ingest accepted it, so it reads)."""
    try:
        return content_digest(pending.path, fmt=fmt, limits=limits)
    except ContentUnreadable as exc:  # the ingest and the digest disagree: refuse, never register unrecognisable
        log.error("content digest failed on a validated upload", extra={"format": fmt})
        raise InvalidInput(slug="invalid-dataset", detail=str(exc), extra={"reason": "unreadable"}) from None


def _validate(
    blobs: BlobStore,
    pending: PendingBlob,
    *,
    sha256: str,
    upload: UploadRequest,
    limits: IngestLimits,
    tokenizer: LoadedTokenizer | None = None,
) -> _Validated:
    """Parse the rows (refusing what the ingest refuses) and adopt the body as its blob."""
    if upload.text_options is not None and tokenizer is not None:
        return _validate_text(
            blobs,
            pending,
            sha256=sha256,
            upload=upload,
            options=upload.text_options,
            tokenizer=tokenizer,
            limits=limits,
        )
    try:
        modality = resolve_modality(
            pending.path, fmt=upload.fmt, declared=upload.modality, options=upload.image_options, limits=limits
        )
        if modality == "image":
            return _validate_images(blobs, pending, sha256=sha256, upload=upload, limits=limits)
        parsed = parse_dataset(
            pending.path,
            fmt=upload.fmt,
            label_column=upload.label_column,
            task=upload.task,
            limits=limits,
            classes=upload.class_list,
            preparation=upload.preparation,
            unit_column=upload.privacy_unit_column,
        )
    except DatasetValidationError as exc:
        raise invalid_dataset(exc) from exc
    facts = dataset_facts(parsed)
    feature_names = list(parsed.feature_names) if parsed.feature_names else None
    public_classes = parsed.classes
    del parsed
    n_units = facts["n_units"]
    _check_delta(upload, n_rows=int(facts["n_rows"]), n_units=n_units)
    digest = _digest_of(pending, fmt=upload.fmt, limits=limits)
    key, created = blobs.adopt(pending.path, sha256, keep_pending=True)
    return _Validated(
        sha256=sha256,
        digest=digest,
        key=key,
        created=created,
        facts=facts,
        feature_names=feature_names,
        class_names=public_classes.names if public_classes is not None else None,
    )


def _check_delta(upload: UploadRequest, *, n_rows: int, n_units: int | None = None) -> None:
    """δ must be below 1/n for the n protected units: rows, or the persons of a privacy unit column."""
    n, what = (n_rows, "rows") if n_units is None else (n_units, "privacy units")
    if upload.delta >= 1.0 / n:
        raise InvalidInput(
            slug="invalid-budget",
            detail=f"delta must be below 1/n = {format_remaining(1.0 / n)} for n = {n} {what}",
        )


def _validate_images(
    blobs: BlobStore, pending: PendingBlob, *, sha256: str, upload: UploadRequest, limits: IngestLimits
) -> _Validated:
    """Decode the images (refusing what the ingest refuses), store their uint8 array as its own
    blob and adopt the body as the upload's blob, as sent."""
    try:
        if upload.preparation is not None:
            raise DatasetValidationError(
                "bad-image-options", "preparation= applies to rows of numbers; image datasets are scaled to x / 255"
            )
        parsed = parse_images(
            pending.path,
            fmt=upload.fmt,
            task=upload.task,
            classes=upload.class_list,
            limits=limits,
            options=upload.image_options,
        )
    except DatasetValidationError as exc:
        raise invalid_dataset(exc) from exc
    facts = image_facts(parsed)
    _check_delta(upload, n_rows=int(facts["n_rows"]))
    class_names = parsed.classes.names if parsed.classes is not None else None
    digest = _digest_of(pending, fmt=upload.fmt, limits=limits)
    array = stage_image_array(blobs, parsed.images)
    del parsed
    key, created = _adopt_beside_array(blobs, pending, sha256=sha256, array=array)
    return _Validated(
        sha256=sha256,
        digest=digest,
        key=key,
        created=created,
        facts=facts,
        feature_names=None,
        class_names=class_names,
        modality="image",
        array=array,
    )


def _adopt_beside_array(blobs: BlobStore, pending: PendingBlob, *, sha256: str, array: StagedArray) -> tuple[str, bool]:
    """Adopt the upload's body as its blob; if that fails, remove the array staged beside it
    (a refused or failed upload leaves no blob behind)."""
    try:
        return blobs.adopt(pending.path, sha256, keep_pending=True)
    except BaseException:
        if array.created:
            blobs.delete(array.key)
        array.pending.discard()
        raise


def _validate_text(
    blobs: BlobStore,
    pending: PendingBlob,
    *,
    sha256: str,
    upload: UploadRequest,
    options: TextOptions,
    tokenizer: LoadedTokenizer,
    limits: IngestLimits,
) -> _Validated:
    """Read the JSON Lines records twice, streamed: once to validate them and resolve the task and
    labels, once to tokenise them into the token-id array stored as its own blob. The body is
    adopted as the upload's blob, as sent (the worker re-reads the labels from it)."""
    try:
        if upload.preparation is not None:
            raise TextValidationError("bad-text-options", "preparation= applies to rows of numbers, not to text")
        check_text_options(options, limits=limits)
        scanned = scan_text(pending.path, task=upload.task, classes=upload.class_list, options=options, limits=limits)
        _check_delta(upload, n_rows=scanned.n_rows, n_units=scanned.n_units)
        digest = _digest_of(pending, fmt=upload.fmt, limits=limits)
        array = stage_token_array(
            blobs,
            lambda out: write_token_rows(
                pending.path,
                options=options,
                tokenizer=tokenizer.tokenizer,
                n_rows=scanned.n_rows,
                limits=limits,
                out=out,
            ),
        )
    except TextValidationError as exc:
        raise invalid_text(exc) from exc
    except DatasetValidationError as exc:
        raise invalid_dataset(exc) from exc
    key, created = _adopt_beside_array(blobs, pending, sha256=sha256, array=array)
    return _Validated(
        sha256=sha256,
        digest=digest,
        key=key,
        created=created,
        facts=scanned.facts(max_length=options.max_length),
        feature_names=None,
        class_names=scanned.classes.names if scanned.classes is not None else None,
        modality="text",
        array=array,
        text=_TextColumns(
            tokenizer_id=tokenizer.id,
            vocab_size=tokenizer.tokenizer.vocab_size,
            pad_id=tokenizer.tokenizer.pad_id,
            text_field=options.fields.text,
            label_field=options.fields.label if scanned.task == "classification" else None,
        ),
    )
