"""Register, train, list and read a tenant's tokenizers, and load one to tokenise an upload.

Tokenizers are public: their vocabulary is shown to every reader of a dataset tokenised with
them and sizes every model trained on it. So a tokenizer is either uploaded (a Hugging Face
``tokenizer.json``, checked by loading it) or trained here on a *public* text dataset; training
one on a private dataset is refused, because a vocabulary learned from private text holds the
strings that occur in it. Stored by content hash, tenant-scoped: another tenant's id answers 404.

Beside kernel/tokenizers/ rather than in it: training reads a dataset's upload through the ingest,
which itself tokenises text uploads with those tokenizers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.db.engine import Database
from kernel.db.orm import BaseModelRecord, Dataset, TokenizerRecord
from kernel.errors import Conflict, InvalidInput, TooLarge, not_found
from kernel.ingest.jsonl import JsonlFields, read_records
from kernel.ingest.limits import IngestLimits
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.storage.references import discard_unreferenced_blob, lock_blob_key
from kernel.tokenizers.base import BYTE_TOKENIZER_ID, TextTokenizer
from kernel.tokenizers.byte import ByteTokenizer
from kernel.tokenizers.hugging_face import (
    MIN_TRAINED_VOCAB,
    HuggingFaceTokenizer,
    load_tokenizer_json,
    stored_tokenizer,
    train_bpe,
)

__all__ = [
    "LoadedTokenizer",
    "TokenizerOnPrivateData",
    "TrainRequest",
    "list_tokenizers",
    "load_for_upload",
    "register_tokenizer",
    "tokenizer_for",
    "tokenizer_too_large",
    "train_tokenizer",
]

log = logging.getLogger("privtrain.tokenizers")


class TokenizerOnPrivateData(Conflict):
    def __init__(self, dataset_id: str) -> None:
        super().__init__(
            slug="tokenizer-on-private-data",
            detail=f"dataset {dataset_id} is private: a tokenizer's vocabulary is public (shown with every "
            "dataset tokenised with it), and a vocabulary learned from private text reveals strings that "
            "occur in it, with no privacy accounting. Train the tokenizer on a public text dataset "
            "(uploaded with public=true), or use the built-in byte tokenizer, which learns nothing",
            extra={"dataset_id": dataset_id},
        )


def tokenizer_too_large(limit: int) -> TooLarge:
    """A tokenizer.json over ``PRIVTRAIN_MAX_TOKENIZER_BYTES``: refused before it is read."""
    return TooLarge(
        slug="payload-too-large",
        detail=f"a tokenizer.json may have at most {limit} bytes",
        extra={"reason": "tokenizer-too-large"},
    )


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer ready to encode, and the id the dataset records."""

    id: str
    tokenizer: TextTokenizer


@dataclass(frozen=True)
class TrainRequest:
    """What a training request asked for, besides its dataset."""

    vocab_size: int
    name: str


def register_tokenizer(
    *,
    db: Database,
    blobs: BlobStore,
    tenant_id: str,
    pending: PendingBlob,
    name: str,
    pad_token: str | None,
    source: str | None,
    limits: IngestLimits,
) -> TokenizerRecord:
    """Check an uploaded tokenizer.json and register it (blocking: run it in a thread). The
    pending blob is always discarded; a refusal stores nothing."""
    try:
        if pending.size > limits.max_tokenizer_bytes:
            raise tokenizer_too_large(limits.max_tokenizer_bytes)
        sha256 = pending.finish()
        loaded = load_tokenizer_json(
            pending.path.read_bytes(), pad_token=pad_token, max_vocab=limits.max_tokenizer_vocab
        )
        key, created = blobs.adopt(pending.path, sha256, keep_pending=True)
    except BaseException:
        pending.discard()
        raise
    try:
        return _insert(
            db,
            blobs,
            key=key,
            created=created,
            restore=pending,
            record=TokenizerRecord(
                tenant_id=tenant_id,
                name=name,
                kind="uploaded",
                sha256=sha256,
                blob_key=key,
                size_bytes=pending.size,
                vocab_size=loaded.vocab_size,
                pad_id=loaded.pad_id,
                source=source,
            ),
        )
    finally:
        pending.discard()


def train_tokenizer(
    *, db: Database, blobs: BlobStore, tenant_id: str, dataset: Dataset, request: TrainRequest, limits: IngestLimits
) -> TokenizerRecord:
    """Learn a byte-level BPE from a public text dataset's texts (blocking: run it in a thread).

    ``dataset`` is one the caller may read; a private one is refused with
    :class:`TokenizerOnPrivateData` before a single text is read."""
    if not dataset.public:
        raise TokenizerOnPrivateData(dataset.id)
    if dataset.modality != "text" or dataset.text_field is None:
        raise InvalidInput(
            slug="tokenizer-needs-text-dataset",
            detail=f"dataset {dataset.id} is not a text dataset; a tokenizer learns from a JSON Lines upload's texts",
        )
    if not MIN_TRAINED_VOCAB <= request.vocab_size <= limits.max_tokenizer_vocab:
        raise InvalidInput(
            slug="tokenizer-vocab-size",
            detail=f"vocab_size must be between {MIN_TRAINED_VOCAB} and {limits.max_tokenizer_vocab}",
        )
    fields = JsonlFields(text=dataset.text_field, label=dataset.label_column or JsonlFields().label)
    texts: Iterator[str] = (
        record.text for record in read_records(blobs.local_path(dataset.blob_key), fields=fields, limits=limits)
    )
    trained = train_bpe(texts, vocab_size=request.vocab_size)
    return _store_trained(db, blobs, tenant_id=tenant_id, dataset_id=dataset.id, name=request.name, trained=trained)


def _store_trained(
    db: Database, blobs: BlobStore, *, tenant_id: str, dataset_id: str, name: str, trained: HuggingFaceTokenizer
) -> TokenizerRecord:
    body = trained.to_json().encode("utf-8")
    pending = blobs.begin()
    try:
        pending.write(body)
        sha256 = pending.finish()
        key, created = blobs.adopt(pending.path, sha256, keep_pending=True)
        return _insert(
            db,
            blobs,
            key=key,
            created=created,
            restore=pending,
            record=TokenizerRecord(
                tenant_id=tenant_id,
                name=name,
                kind="trained",
                sha256=sha256,
                blob_key=key,
                size_bytes=len(body),
                vocab_size=trained.vocab_size,
                pad_id=trained.pad_id,
                trained_from_dataset_id=dataset_id,
            ),
        )
    finally:
        pending.discard()


def _insert(
    db: Database, blobs: BlobStore, *, key: str, created: bool, restore: PendingBlob, record: TokenizerRecord
) -> TokenizerRecord:
    """Commit the row under the blob's lock; a blob this request created goes if the row does not."""
    registered = False
    try:
        with db.write_transaction() as session:
            lock_blob_key(session, key)
            session.add(record)
            session.flush()
        registered = True
        if not created:
            blobs.adopt(restore.path, record.sha256)  # restore the shared blob if its other owner removed it
    finally:
        if created and not registered:
            discard_unreferenced_blob(db, blobs, key=key)
    log.info("tokenizer registered", extra={"tokenizer_id": record.id, "tenant_id": record.tenant_id})
    return record


def list_tokenizers(session: Session, tenant_id: str) -> list[TokenizerRecord]:
    return list(
        session.scalars(
            select(TokenizerRecord)
            .where(TokenizerRecord.tenant_id == tenant_id)
            .order_by(TokenizerRecord.created_at.desc(), TokenizerRecord.id.desc())
        )
    )


def tokenizer_for(session: Session, tenant_id: str, tokenizer_id: str) -> TokenizerRecord:
    """The tenant's tokenizer; 404 for another tenant's (existence never leaks)."""
    record = session.get(TokenizerRecord, tokenizer_id)
    if record is None or record.tenant_id != tenant_id:
        raise not_found("tokenizer")
    return record


BASE_MODEL_TOKENIZER = "base:"
"""``tokenizer=base:<base_model_id>``: the tokenizer a Transformers checkpoint came with."""


def _base_model_tokenizer(session: Session, *, tenant_id: str, base_model_id: str) -> str:
    record = session.get(BaseModelRecord, base_model_id)
    if record is None or record.tenant_id != tenant_id:
        raise InvalidInput(
            slug="unknown-tokenizer",
            detail=f"tokenizer=base:{base_model_id}: no base model of yours has this id (GET /v1/base-models)",
        )
    if record.tokenizer_id is None:
        raise InvalidInput(
            slug="base-model-without-tokenizer",
            detail=f"base model {base_model_id} came without a tokenizer.json; upload the model's tokenizer "
            "(POST /v1/tokenizers) and name its id, or upload the checkpoint again with its tokenizer files",
        )
    return record.tokenizer_id


def load_for_upload(db: Database, blobs: BlobStore, *, tenant_id: str, tokenizer_id: str) -> LoadedTokenizer:
    """The tokenizer a text upload names: "byte", one of the tenant's, or "base:<id>", the one a
    tenant's base model came with (422 unknown-tokenizer otherwise, the same for another tenant's id)."""
    if tokenizer_id == BYTE_TOKENIZER_ID:
        return LoadedTokenizer(id=BYTE_TOKENIZER_ID, tokenizer=ByteTokenizer())
    if tokenizer_id.startswith(BASE_MODEL_TOKENIZER):
        with db.read_session() as session:
            tokenizer_id = _base_model_tokenizer(
                session, tenant_id=tenant_id, base_model_id=tokenizer_id.removeprefix(BASE_MODEL_TOKENIZER)
            )
    with db.read_session() as session:
        record = session.get(TokenizerRecord, tokenizer_id)
        if record is None or record.tenant_id != tenant_id:
            raise InvalidInput(
                slug="unknown-tokenizer",
                detail=f"tokenizer {tokenizer_id!r} is not one of yours; use tokenizer=byte or an id from "
                "GET /v1/tokenizers",
            )
        key, pad_id = record.blob_key, record.pad_id
    return LoadedTokenizer(
        id=tokenizer_id, tokenizer=stored_tokenizer(blobs.local_path(key).read_bytes(), pad_id=pad_id)
    )
