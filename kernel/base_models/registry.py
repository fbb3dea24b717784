"""Register, list, read and delete a tenant's base models (public pretrained weights).

Upload: the route streams the body into a pending blob; here the file's tensor table is read
without torch (``safetensors_header``), the architecture's own table is asked of a capped child
process (``expected``), and every name and shape must match exactly, every dtype fit (a floating
parameter takes any floating dtype). Only then is the body adopted as a content-addressed blob
and the row written; a refusal leaves neither behind. Base models are tenant-scoped: another
tenant's id answers 404.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel import suggestions
from kernel.base_models.dtypes import FLOAT_DTYPES, dtype_fits
from kernel.base_models.expected import expected_tensors
from kernel.base_models.hf_tokenizer import CheckpointTokenizer
from kernel.base_models.safetensors_header import TensorEntry, read_header
from kernel.db.engine import Database
from kernel.db.idempotency import IdempotentRequest, create_once, earlier
from kernel.db.orm import BaseModelRecord, Job, TokenizerRecord
from kernel.errors import Conflict, InvalidInput, not_found
from kernel.jobs.status import ACTIVE_STATUSES
from kernel.model_catalogue import MODELS, ModelIncompatible, ModelSizeLimits, UnknownModel, get_model
from kernel.schemas.stored_spec import StoredJobSpec, parse_stored_spec
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.storage.references import discard_unreferenced_blob, lock_blob_key

__all__ = [
    "MAX_LISTED_NAMES",
    "BaseModelInUse",
    "BaseModelUpload",
    "RegisteredBaseModel",
    "base_model_for",
    "delete_base_model",
    "list_base_models",
    "register_base_model",
    "replayed_upload",
    "store_base_model",
]

log = logging.getLogger("privtrain.base_models")
MAX_LISTED_NAMES = 20
"""A names mismatch lists at most this many missing and unexpected names."""


@dataclass(frozen=True)
class BaseModelUpload:
    """What an upload asked for, besides its body."""

    name: str
    architecture: str
    params: dict[str, Any]
    input_shape: tuple[int, ...]
    n_outputs: int
    source: str | None
    idempotency_key: str | None


@dataclass(frozen=True)
class RegisteredBaseModel:
    record: BaseModelRecord
    replayed: bool


class BaseModelInUse(Conflict):
    def __init__(self, base_model_id: str, job_ids: list[str]) -> None:
        super().__init__(
            slug="base-model-in-use",
            detail=f"base model {base_model_id} is the starting point of queued or running jobs "
            f"({', '.join(job_ids[:5])}); delete it once they have ended",
            extra={"job_ids": job_ids},
        )


def _mismatch(slug: str, detail: str, **extra: Any) -> InvalidInput:
    return InvalidInput(slug=slug, detail=detail, extra=extra)


def upload_hash(sha256: str, upload: BaseModelUpload) -> str:
    request = {
        "sha256": sha256,
        "name": upload.name,
        "architecture": upload.architecture,
        "params": upload.params,
        "input_shape": list(upload.input_shape),
        "n_outputs": upload.n_outputs,
        "source": upload.source,
    }
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def normalised_params(upload: BaseModelUpload, limits: ModelSizeLimits) -> dict[str, Any]:
    """The catalogue's validation of the architecture and its params (defaults filled), torch-free.

    The facts stand for any dataset the weights fit (``facts_for_weights``): the declared input
    shape; a language model's task, or classification with ``n_outputs`` classes; a text model's
    vocabulary as its params give it."""
    try:
        model = get_model(upload.architecture)
    except UnknownModel:
        raise InvalidInput(
            slug="unknown-model",
            detail=suggestions.unknown_name(kind="model", name=upload.architecture, known=MODELS.names()),
        ) from None
    facts = model.facts_for_weights(upload.params, input_shape=upload.input_shape, n_outputs=upload.n_outputs)
    try:
        return model.validate(upload.params, facts, limits=limits)
    except ModelIncompatible as exc:
        raise InvalidInput(slug="model-incompatible", detail=str(exc)) from None


def check_tensors(found: dict[str, TensorEntry], expected: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Names, then dtypes, then shapes must match the architecture (stable problem types).

    Names and shapes match exactly; a floating parameter takes any floating dtype (the worker
    casts it on loading), anything else its own dtype (``dtypes.dtype_fits``)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise _mismatch(
            "base-model-names-mismatch",
            f"the file's tensor names differ from the architecture's: {len(missing)} missing, "
            f"{len(unexpected)} unexpected",
            missing=missing[:MAX_LISTED_NAMES],
            unexpected=unexpected[:MAX_LISTED_NAMES],
        )
    for name, (dtype, _shape) in expected.items():
        if not dtype_fits(found[name].dtype, expected=dtype):
            takes = "any floating dtype (F16, BF16, F32 or F64)" if dtype in FLOAT_DTYPES else dtype
            raise _mismatch(
                "base-model-dtype-mismatch",
                f"tensor {name!r} is {found[name].dtype}; the architecture's is {dtype} and takes {takes}",
                tensor=name,
            )
    for name, (_, shape) in expected.items():
        if found[name].shape != shape:
            raise _mismatch(
                "base-model-shape-mismatch",
                f"tensor {name!r} has shape {list(found[name].shape)}; the architecture's is {list(shape)}",
                tensor=name,
            )


def replayed_upload(db: Database, request: IdempotentRequest, *, pending: PendingBlob) -> RegisteredBaseModel | None:
    """The base model an earlier request with this Idempotency-Key registered (the new body is
    discarded), or None."""
    with db.read_session() as session:
        replay = earlier(session, BaseModelRecord, request)
        if replay is None:
            return None
        session.expunge(replay)
    pending.discard()
    return RegisteredBaseModel(record=replay, replayed=True)


def register_base_model(
    *,
    db: Database,
    blobs: BlobStore,
    tenant_id: str,
    pending: PendingBlob,
    upload: BaseModelUpload,
    limits: ModelSizeLimits,
) -> RegisteredBaseModel:
    """Validate the received file and register it (blocking: run it in a thread). The pending
    blob is always discarded; a refusal stores nothing."""
    try:
        sha256 = pending.finish()
        request = IdempotentRequest(
            tenant_id=tenant_id, key=upload.idempotency_key, what="upload", request_hash=upload_hash(sha256, upload)
        )
        replay = replayed_upload(db, request, pending=pending)
        if replay is not None:
            return replay
        params = normalised_params(upload, limits)
        found = read_header(pending.path)
        check_tensors(
            found,
            expected_tensors(
                architecture=upload.architecture,
                params=params,
                input_shape=upload.input_shape,
                n_outputs=upload.n_outputs,
            ),
        )
    except BaseException:
        pending.discard()
        raise
    return store_base_model(
        db=db,
        blobs=blobs,
        tenant_id=tenant_id,
        pending=pending,
        sha256=sha256,
        upload=upload,
        params=params,
        request=request,
    )


def store_base_model(
    *,
    db: Database,
    blobs: BlobStore,
    tenant_id: str,
    pending: PendingBlob,
    sha256: str,
    upload: BaseModelUpload,
    request: IdempotentRequest,
    params: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    tokenizer: CheckpointTokenizer | None = None,
) -> RegisteredBaseModel:
    """Adopt the checked weights file (finished, ``sha256``) as a blob and write the row, once per
    Idempotency-Key; ``tokenizer``: the checkpoint's, registered in the same transaction. Pending
    files are always discarded, the blobs too unless a row uses them. ``extra``: the row's
    format-specific columns (``format``, ``model_class``…)."""
    adopted: list[tuple[str, bool, PendingBlob, str]] = []  # (key, created, pending, sha256)
    try:
        adopted.append((*blobs.adopt(pending.path, sha256, keep_pending=True), pending, sha256))
        if tokenizer is not None:
            adopted.append(
                (
                    *blobs.adopt(tokenizer.pending.path, tokenizer.sha256, keep_pending=True),
                    tokenizer.pending,
                    tokenizer.sha256,
                )
            )
    except BaseException:
        for key, created, _, _ in adopted:
            if created:
                discard_unreferenced_blob(db, blobs, key=key)
        pending.discard()
        if tokenizer is not None:
            tokenizer.pending.discard()
        raise
    key = adopted[0][0]
    registered = False

    def create() -> RegisteredBaseModel:
        with db.write_transaction() as session:
            for blob_key, _, _, _ in adopted:
                lock_blob_key(session, blob_key)
            tokenizer_id = None
            if tokenizer is not None:
                tokenizer_key = adopted[1][0]
                tokenizer_row = TokenizerRecord(
                    tenant_id=tenant_id,
                    name=f"{upload.name} (tokenizer)"[:200],
                    kind="uploaded",
                    sha256=tokenizer.sha256,
                    blob_key=tokenizer_key,
                    size_bytes=tokenizer.pending.size,
                    vocab_size=tokenizer.vocab_size,
                    pad_id=tokenizer.pad_id,
                    source=upload.source,
                )
                session.add(tokenizer_row)
                session.flush()
                tokenizer_id = tokenizer_row.id
            record = BaseModelRecord(
                tenant_id=tenant_id,
                name=upload.name,
                architecture=upload.architecture,
                params=upload.params if params is None else params,
                input_shape=list(upload.input_shape),
                n_outputs=upload.n_outputs,
                sha256=sha256,
                blob_key=key,
                size_bytes=pending.size,
                source=upload.source,
                idempotency_key=upload.idempotency_key,
                request_hash=request.request_hash if upload.idempotency_key else None,
                tokenizer_id=tokenizer_id,
                **(extra or {}),
            )
            session.add(record)
            session.flush()
        return RegisteredBaseModel(record=record, replayed=False)

    try:
        result = create_once(
            db,
            BaseModelRecord,
            request,
            create=create,
            replay=lambda _session, first: RegisteredBaseModel(record=first, replayed=True),
        )
        registered = not result.replayed
        if registered:
            for _, created, restore, blob_sha in adopted:
                if not created:
                    blobs.adopt(restore.path, blob_sha)  # restore a shared blob its other owner removed
    finally:
        for blob_key, created, restore, _ in adopted:
            if created and not registered:
                discard_unreferenced_blob(db, blobs, key=blob_key)
            restore.discard()
    return result


def list_base_models(session: Session, tenant_id: str) -> list[BaseModelRecord]:
    return list(
        session.scalars(
            select(BaseModelRecord)
            .where(BaseModelRecord.tenant_id == tenant_id)
            .order_by(BaseModelRecord.created_at.desc(), BaseModelRecord.id.desc())
        )
    )


def base_model_for(session: Session, tenant_id: str, base_model_id: str) -> BaseModelRecord:
    """The tenant's base model; 404 for another tenant's (existence never leaks)."""
    record = session.get(BaseModelRecord, base_model_id)
    if record is None or record.tenant_id != tenant_id:
        raise not_found("base model")
    return record


def jobs_using(session: Session, base_model_id: str, *, active_only: bool) -> list[str]:
    """Jobs whose ``model.init`` names this base model."""
    query = select(Job.id, Job.spec)
    if active_only:
        query = query.where(Job.status.in_(ACTIVE_STATUSES))
    return [job_id for job_id, spec in session.execute(query) if _starts_from(parse_stored_spec(spec)) == base_model_id]


def _starts_from(spec: StoredJobSpec) -> str | None:
    """The base model a job's request named as its start, if any."""
    return None if spec.model.init is None else spec.model.init.base_model_id


def delete_base_model(db: Database, blobs: BlobStore, *, tenant_id: str, base_model_id: str) -> None:
    """Refused while a queued or running job starts from it; its blob goes when no row uses it."""
    with db.write_transaction() as session:
        record = base_model_for(session, tenant_id, base_model_id)
        active = jobs_using(session, base_model_id, active_only=True)
        if active:
            raise BaseModelInUse(base_model_id, active)
        key = record.blob_key
        session.delete(record)
    discard_unreferenced_blob(db, blobs, key=key)
