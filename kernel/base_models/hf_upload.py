"""Register a Transformers checkpoint (a zipped ``save_pretrained`` folder) as an `hf` base model.

The archive is read without torch (``hf_archive``), its ``config.json`` turned into the `hf`
model's params by the capped child process (``expected.checkpoint_expectation``, which also
builds the model on the meta device), and every tensor the model needs must be found with its
exact shape and a dtype that fits. The checkpoint may be the task's model
(``BertForSequenceClassification``) or its bare body (``BertModel``, names without the ``bert.``
prefix), as ``from_pretrained`` accepts both; a head it lacks is created fresh by every job that
starts from it, and a tied language-model head (saved once, as the embedding) is written out as
its own tensor, since the `hf` model never ties weights. Tensors of another task's head (an LM's
``lm_head`` under a classifier, a masked-LM's ``cls.``) are left out, and so are the position
buffers older Transformers saved; any other tensor the model does not have is refused.

What is stored is one safetensors file under the wrapper's names (``model.`` + Transformers'),
the tensors' bytes as uploaded: jobs load it like any base model. The row keeps the archive's own
SHA-256 beside the stored file's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from kernel.base_models.expected import CheckpointExpectation, ShapesUnavailable, checkpoint_expectation
from kernel.base_models.hf_archive import HFArchive, open_archive, write_safetensors
from kernel.base_models.hf_tokenizer import CheckpointTokenizer, checkpoint_tokenizer
from kernel.base_models.registry import (
    MAX_LISTED_NAMES,
    BaseModelUpload,
    RegisteredBaseModel,
    check_tensors,
    replayed_upload,
    store_base_model,
)
from kernel.base_models.safetensors_header import TensorEntry
from kernel.db.engine import Database
from kernel.db.idempotency import IdempotentRequest
from kernel.errors import InvalidInput
from kernel.ingest.limits import IngestLimits
from kernel.model_catalogue import ModelSizeLimits
from kernel.storage.blobs import BlobStore, PendingBlob
from privtrain_common.zoo.hf.checkpoint import task_of
from privtrain_common.zoo.hf.definition import family_of
from privtrain_common.zoo.hf.families import FAMILIES, input_shape_of
from privtrain_common.zoo.hf.transformers_config import WRAPPER_PREFIX, saved_name

OTHER_HEADS = ("lm_head.", "cls.", "classifier.", "score.", "pre_classifier.", "qa_outputs.", "vocab_")
"""Checkpoint tensors of another task's head: left out when the job's task has its own."""
OLD_BUFFERS = (".position_ids", ".masked_bias", ".attn.bias")
"""Buffers older Transformers versions saved with the weights (recomputed, never trained)."""


@dataclass(frozen=True)
class HFUpload:
    name: str
    task: str | None
    source: str | None
    idempotency_key: str | None


@dataclass(frozen=True)
class MappedCheckpoint:
    """Which checkpoint tensor each of the model's tensors comes from, and what the upload lacks."""

    sources: dict[str, str]
    missing_head: tuple[str, ...]


def _in(name: str, members: tuple[str, ...]) -> bool:
    return any(name == member or name.startswith(member + ".") for member in members)


def _candidates(name: str, prefix: str, model_type: str = "") -> list[str]:
    """A wrapper name's checkpoint names: the task model's, and a bare body's (prefix dropped), each
    also as ``save_pretrained`` writes it (ViT's modules keep their earlier names on disk)."""
    inner = name[len(WRAPPER_PREFIX) :]
    names = [inner]
    if prefix and inner.startswith(prefix + "."):
        names.append(inner[len(prefix) + 1 :])
    return list(dict.fromkeys([*names, *(saved_name(model_type, n) for n in names)]))


def map_checkpoint(archive: HFArchive, expected: CheckpointExpectation) -> MappedCheckpoint:
    """Each tensor of the model to a checkpoint tensor; the names-mismatch problem otherwise."""
    found = archive.tensors
    prefix = expected.base_model_prefix
    embedding = next(
        (f"{member}.weight" for member in expected.embedding_members if f"{member}.weight" in expected.tensors), None
    )
    sources: dict[str, str] = {}
    missing: list[str] = []
    missing_head: list[str] = []
    model_type = str(expected.params["config"]["model_type"])
    for name in expected.tensors:
        source = next((c for c in _candidates(name, prefix, model_type) if c in found), None)
        if source is None and expected.tied_lm_head and name == f"{WRAPPER_PREFIX}lm_head.weight" and embedding:
            source = next((c for c in _candidates(embedding, prefix) if c in found), None)  # saved once, tied
        if source is not None:
            sources[name] = source
        elif _in(name, expected.head_members):
            missing_head.append(name)
        else:
            missing.append(name)
    used = set(sources.values())
    unexpected = sorted(
        name
        for name in found
        if name not in used and not name.startswith(OTHER_HEADS) and not name.endswith(OLD_BUFFERS)
    )
    if missing or unexpected:
        raise InvalidInput(
            slug="base-model-names-mismatch",
            detail=f"the checkpoint's tensors differ from a {expected.model_class} built from its config.json: "
            f"{len(missing)} missing, {len(unexpected)} unexpected",
            extra={
                "missing": [n[len(WRAPPER_PREFIX) :] for n in missing[:MAX_LISTED_NAMES]],
                "unexpected": unexpected[:MAX_LISTED_NAMES],
            },
        )
    return MappedCheckpoint(sources=sources, missing_head=tuple(missing_head))


def _n_outputs(expected: CheckpointExpectation, mapped: MappedCheckpoint) -> int:
    """The head's outputs (a classifier's labels, an LM's vocabulary), or 0 when the checkpoint has
    no head: every job then starts with a fresh one (``head_is_new``)."""
    if mapped.missing_head:
        return 0
    if expected.task == "causal-lm":
        return int(expected.params["config"]["vocab_size"])
    return expected.labels or 2


def _check_before_building(config: dict[str, object], *, task: str | None) -> None:
    """What the config alone refuses (an unsupported model type, no task), here rather than after
    the seconds the capped child takes to build the model."""
    try:
        family_of(config)
        task_of(config, task)
    except ValueError as exc:
        raise ShapesUnavailable(f"the checkpoint's config.json: {exc}") from None


def upload_hash(archive_sha256: str, upload: HFUpload) -> str:
    request = {
        "format": "hf",
        "sha256": archive_sha256,
        "name": upload.name,
        "task": upload.task,
        "source": upload.source,
    }
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def register_hf_base_model(
    *,
    db: Database,
    blobs: BlobStore,
    tenant_id: str,
    pending: PendingBlob,
    upload: HFUpload,
    limits: ModelSizeLimits,
    tokenizer_limits: IngestLimits,
    max_bytes: int,
) -> RegisteredBaseModel:
    """Validate the received archive and register its weights (blocking: run it in a thread). The
    archive is always discarded, and the converted file too unless it was registered."""
    weights: PendingBlob | None = None
    tokenizer: CheckpointTokenizer | None = None
    try:
        archive_sha256 = pending.finish()
        request = IdempotentRequest(
            tenant_id=tenant_id,
            key=upload.idempotency_key,
            what="upload",
            request_hash=upload_hash(archive_sha256, upload),
        )
        replay = replayed_upload(db, request, pending=pending)
        if replay is not None:
            return replay
        archive = open_archive(pending.path, max_bytes=max_bytes)
        _check_before_building(archive.config, task=upload.task)
        tokenizer = checkpoint_tokenizer(archive, config=archive.config, blobs=blobs, limits=tokenizer_limits)
        expected = checkpoint_expectation(config=archive.config, task=upload.task)
        if expected.parameters > limits.max_parameters:
            raise InvalidInput(
                slug="model-incompatible",
                detail=f"the checkpoint's model has {expected.parameters:,} parameters; this service trains at most "
                f"{limits.max_parameters:,}",
            )
        mapped = map_checkpoint(archive, expected)
        found = {
            name: TensorEntry(
                name=name,
                dtype=archive.tensors[source].located.entry.dtype,
                shape=archive.tensors[source].located.entry.shape,
            )
            for name, source in mapped.sources.items()
        }
        check_tensors(found, {name: expected.tensors[name] for name in mapped.sources})
        weights = blobs.begin(max_bytes=None)
        write_safetensors(archive, sources=mapped.sources, out=weights)
        weights_sha256 = weights.finish()
    except BaseException:
        pending.discard()
        for written in (weights, None if tokenizer is None else tokenizer.pending):
            if written is not None:
                written.discard()
        raise
    pending.discard()
    config = expected.params["config"]
    family = FAMILIES[config["model_type"]]
    described = BaseModelUpload(
        name=upload.name,
        architecture="hf",
        params=expected.params,
        input_shape=input_shape_of(family, config),
        n_outputs=_n_outputs(expected, mapped),
        source=upload.source,
        idempotency_key=upload.idempotency_key,
    )
    return store_base_model(
        db=db,
        blobs=blobs,
        tenant_id=tenant_id,
        pending=weights,
        sha256=weights_sha256,
        upload=described,
        request=request,
        extra={
            "format": "hf",
            "model_class": expected.model_class,
            "parameter_count": expected.parameters,
            "archive_sha256": archive_sha256,
        },
        tokenizer=tokenizer,
    )
