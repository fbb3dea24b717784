"""Parse and validate a received upload (table, images or text), compute its content digest and
adopt its body, and an image or text dataset's array, as blobs: the public facts a dataset row holds."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from kernel.datasets.content_identity import ContentUnreadable, content_digest
from kernel.datasets.image_arrays import StagedArray, stage_image_array
from kernel.datasets.text_arrays import stage_token_array
from kernel.datasets.upload_refusals import invalid_dataset, invalid_text
from kernel.datasets.upload_request import UploadRequest
from kernel.errors import InvalidInput
from kernel.ingest import (
    DatasetValidationError,
    IngestFacts,
    IngestLimits,
    Modality,
    dataset_facts,
    image_facts,
    parse_dataset,
    parse_images,
    resolve_modality,
)
from kernel.ingest.text import TextFacts, TextOptions, check_text_options, scan_text, write_token_rows
from kernel.ingest.text_errors import TextValidationError
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.tokenizer_registry import LoadedTokenizer
from privtrain_common.directed_rounding import format_remaining

__all__ = ["TextColumns", "ValidatedUpload", "validate_upload"]

log = logging.getLogger("privtrain.datasets")


@dataclass(frozen=True)
class ValidatedUpload:
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
    text: TextColumns | None = None


@dataclass(frozen=True)
class TextColumns:
    """A text dataset's public declarations, as stored with it."""

    tokenizer_id: str
    vocab_size: int
    pad_id: int
    text_field: str
    label_field: str | None
    """None for a language-modelling dataset (its records have no label)."""


def _digest_of(pending: PendingBlob, *, fmt: str, limits: IngestLimits) -> str:
    """The content digest of a validated upload, read before it is adopted as its blob (the
    ingest accepted it, so it reads)."""
    try:
        return content_digest(pending.path, fmt=fmt, limits=limits)
    except ContentUnreadable as exc:  # the ingest and the digest disagree: refuse, never register unrecognisable
        log.error("content digest failed on a validated upload", extra={"format": fmt})
        raise InvalidInput(slug="invalid-dataset", detail=str(exc), extra={"reason": "unreadable"}) from None


def validate_upload(
    blobs: BlobStore,
    pending: PendingBlob,
    *,
    sha256: str,
    upload: UploadRequest,
    limits: IngestLimits,
    tokenizer: LoadedTokenizer | None = None,
) -> ValidatedUpload:
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
    return ValidatedUpload(
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
) -> ValidatedUpload:
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
    return ValidatedUpload(
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
) -> ValidatedUpload:
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
    return ValidatedUpload(
        sha256=sha256,
        digest=digest,
        key=key,
        created=created,
        facts=scanned.facts(max_length=options.max_length),
        feature_names=None,
        class_names=scanned.classes.names if scanned.classes is not None else None,
        modality="text",
        array=array,
        text=TextColumns(
            tokenizer_id=tokenizer.id,
            vocab_size=tokenizer.tokenizer.vocab_size,
            pad_id=tokenizer.tokenizer.pad_id,
            text_field=options.fields.text,
            label_field=options.fields.label if scanned.task == "classification" else None,
        ),
    )
