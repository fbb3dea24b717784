"""The tokenizer a Transformers checkpoint comes with, registered beside it.

A text dataset must be tokenised with the model's own tokenizer, or its ids mean other tokens
to the model. When the archive holds ``tokenizer.json``, it is checked as an uploaded tokenizer
is (``kernel.tokenizers.hugging_face``), must fit the model (its ids below the config's
``vocab_size``, its pad id the config's ``pad_token_id`` where the config sets one), and is
registered in the same transaction as the base model; ``tokenizer=base:<base_model_id>`` on a
dataset upload then names it. The pad token is the one ``tokenizer_config.json`` (or
``special_tokens_map.json``) names, else the tokenizer's own padding setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernel.base_models.hf_archive import HFArchive, read_json_member, read_member
from kernel.errors import InvalidInput
from kernel.ingest.limits import IngestLimits
from kernel.storage.blobs import BlobStore, PendingBlob
from kernel.tokenizers.hugging_face import load_tokenizer_json

TOKENIZER_FILE = "tokenizer.json"
SETTINGS_FILES = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class CheckpointTokenizer:
    """A checked tokenizer.json, written to a pending blob, waiting for the base model's row."""

    pending: PendingBlob
    sha256: str
    vocab_size: int
    pad_id: int


def _token(value: object) -> str | None:
    """A special token as the settings files write it: a string, or {"content": string}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pad_token(archive: HFArchive) -> str | None:
    for name in SETTINGS_FILES:
        settings = read_json_member(archive, name)
        if settings is not None and _token(settings.get("pad_token")) is not None:
            return _token(settings.get("pad_token"))
    return None


def _mismatch(detail: str) -> InvalidInput:
    return InvalidInput(slug="base-model-tokenizer-mismatch", detail=detail)


def checkpoint_tokenizer(
    archive: HFArchive, *, config: dict[str, Any], blobs: BlobStore, limits: IngestLimits
) -> CheckpointTokenizer | None:
    """The archive's tokenizer, checked against the model's config; None when it has none."""
    if TOKENIZER_FILE not in archive.members:
        return None
    data = read_member(archive, TOKENIZER_FILE, max_bytes=limits.max_tokenizer_bytes)
    loaded = load_tokenizer_json(data, pad_token=_pad_token(archive), max_vocab=limits.max_tokenizer_vocab)
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and loaded.vocab_size > vocab:
        raise _mismatch(
            f"tokenizer.json has {loaded.vocab_size} tokens but the model's vocab_size is {vocab}: the tokenizer is "
            "not this model's"
        )
    pad = config.get("pad_token_id")
    if isinstance(pad, int) and pad != loaded.pad_id:
        raise _mismatch(
            f"tokenizer.json pads with id {loaded.pad_id} but config.json's pad_token_id is {pad}; name the pad token "
            "in tokenizer_config.json (pad_token) or fix the config"
        )
    pending = blobs.begin(max_bytes=None)
    try:
        pending.write(data)
        sha256 = pending.finish()
    except BaseException:
        pending.discard()
        raise
    return CheckpointTokenizer(pending=pending, sha256=sha256, vocab_size=loaded.vocab_size, pad_id=loaded.pad_id)
