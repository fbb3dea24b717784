"""What a dataset upload asks for, the digest an Idempotency-Key retry must match, and what
the registration gives back."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from kernel.db.orm import Dataset, PrivacyBudget
from kernel.ingest import ImageOptions, Preparation
from kernel.ingest.text import TextOptions

__all__ = ["RegisteredDataset", "UploadRequest", "upload_hash"]


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
