"""Registering a received upload as a dataset with its own privacy budget.

The route (``POST /v1/datasets``) parses the parameters and streams the body into a pending
blob; everything after that is here: hash, replay an idempotent retry, parse and validate the
rows, compute their content digest (kernel/datasets/content_identity.py), and in one transaction either refuse
content the tenant already registered (one content, one budget: docs/privacy-model.md §3), or
continue the ledger of the same content that its owner deleted (the tombstone becomes the dataset
again), or register a new dataset and open its ledger. Blocking work: the route runs it in a
worker thread. Refusals are domain errors (kernel/errors.py).

The steps live beside this module: the request and its digest (upload_request), the refusals
(upload_refusals), parsing and storing the body (upload_validation), finding the same content
(content_match) and continuing a deleted dataset's ledger (revival); here they run in order.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.datasets.content_match import match_content, refuse_known_content
from kernel.datasets.revival import revive
from kernel.datasets.upload_refusals import ContentAlreadyRegistered
from kernel.datasets.upload_request import RegisteredDataset, UploadRequest, upload_hash
from kernel.datasets.upload_validation import ValidatedUpload, validate_upload
from kernel.db.engine import Database
from kernel.db.idempotency import IdempotentRequest, create_once, earlier
from kernel.db.orm import Dataset, PrivacyBudget, Tenant
from kernel.ingest import IngestLimits
from kernel.ingest.text import TEXT_FORMATS
from kernel.ledger import operations as ledger
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.storage.references import discard_unreferenced_blob, lock_blob_key
from kernel.tokenizer_registry import load_for_upload

__all__ = ["register_upload"]

log = logging.getLogger("privtrain.datasets")


def _replayed(session: Session, dataset: Dataset) -> RegisteredDataset:
    budget = session.get(PrivacyBudget, dataset.id)
    assert budget is not None
    return RegisteredDataset(dataset=dataset, budget=budget, replayed=True)


def _earlier_upload(db: Database, request: IdempotentRequest) -> RegisteredDataset | None:
    with db.read_session() as session:
        dataset = earlier(session, Dataset, request)
        return _replayed(session, dataset) if dataset is not None else None


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
        "list at upload to make it independent of the rows: the query parameter classes=name0,name1,... "
        "(privtrain datasets upload --classes name0,name1,...; upload_dataset(..., classes=[...]) in Python)."
    )


def _new_dataset(
    tenant_id: str, upload: UploadRequest, body: ValidatedUpload, *, size_bytes: int, request_hash: str
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


def _notices(upload: UploadRequest, body: ValidatedUpload) -> tuple[str, ...]:
    notices = (
        []
        if upload.class_list is not None or body.class_names is None
        else [_observed_classes_notice(body.class_names)]
    )
    if upload.task is None and upload.class_list is None and upload.fmt not in ("zip", *TEXT_FORMATS):
        # a ZIP is classification; a text dataset's task follows from its records' members, not their values
        notices.insert(0, _inferred_task_notice(str(body.facts["task"])))
    return tuple(notices)


def _register(
    db: Database,
    *,
    tenant_id: str,
    upload: UploadRequest,
    body: ValidatedUpload,
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
        match = match_content(session, tenant_id, digest=body.digest, sha256=body.sha256, public=upload.public)
        if match.live is not None:
            raise ContentAlreadyRegistered(match.live)
        dataset = _new_dataset(tenant_id, upload, body, size_bytes=size_bytes, request_hash=request_hash)
        dataset.content_digest = body.digest
        if match.tombstone is not None:
            return revive(session, match.tombstone, dataset, upload, notices=_notices(upload, body))
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
        refuse_known_content(db, tenant_id, sha256)
        tokenizer = (
            load_for_upload(db, blobs, tenant_id=tenant_id, tokenizer_id=upload.text_options.tokenizer)
            if upload.text_options is not None
            else None
        )
        body = validate_upload(blobs, pending, sha256=sha256, upload=upload, limits=limits, tokenizer=tokenizer)
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
