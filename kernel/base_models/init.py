"""Resolve a job's ``model.init`` into the provenance its plan, worker and report use.

Training from given weights changes nothing in the price of the new job (its cost depends only on
its own mechanism), and nothing in any ledger. What the weights mean for the new job's guarantee
depends on where they came from: a base model is public pretrained weights; a job's model is a
function of every job in its init chain (kernel/base_models/init_chain.py), and the chain's jobs on
the new job's own dataset used those rows before, so the guarantee composes their events with the
new job's (docs/privacy-model.md#init-chain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from kernel.access.roles import job_for
from kernel.base_models.dtypes import stored_dtypes
from kernel.base_models.init_chain import resolve_chain
from kernel.base_models.registry import base_model_for
from kernel.datasets.facts import public_class_list
from kernel.datasets.status import DatasetStatus
from kernel.datasets.stored_facts import facts_of
from kernel.db.orm import Dataset, Tenant
from kernel.errors import InvalidInput, NotFound
from kernel.jobs.status import JobStatus
from kernel.model_catalogue import get_model
from kernel.schemas.jobs import ModelInit
from kernel.schemas.stored_spec import stored_spec
from kernel.storage.blobs import BlobStore


@dataclass(frozen=True)
class InitSource:
    """What a job's starting weights are: enough to check they fit and to say where they came from."""

    architecture: str
    params: dict[str, Any]
    input_shape: tuple[int, ...]
    provenance: dict[str, Any]
    """Stored in the job's spec as ``init`` (public: the report shows it)."""


def _invalid(detail: str) -> InvalidInput:
    return InvalidInput(slug="invalid-model-init", detail=detail)


def resolve_init(
    session: Session,
    tenant: Tenant,
    init: ModelInit,
    *,
    blobs: BlobStore | None = None,
    dataset: Dataset | None = None,
) -> InitSource:
    """The caller's base model, or a succeeded job whose model the caller may read (404 otherwise,
    exactly as ``GET /v1/jobs/{id}/model`` answers: docs/sharing.md#fine-tuning-from-another-job).

    ``blobs``: where the base model's file is stored; given, the provenance also records the dtypes
    it was uploaded in (``stored_dtypes``), so the report can say that the weights were cast.
    ``dataset``: the new job's dataset; given, a job's provenance also holds its init ``chain``
    (kernel/base_models/init_chain.py), whose events on this dataset the guarantee composes."""
    if init.base_model_id is not None:
        record = base_model_for(session, tenant.id, init.base_model_id)
        dtypes = {} if blobs is None else {"stored_dtypes": stored_dtypes(blobs, record)}
        return InitSource(
            architecture=record.architecture,
            params=dict(record.params),
            input_shape=tuple(record.input_shape),
            provenance={
                "kind": "base-model",
                "base_model_id": record.id,
                "name": record.name,
                "source": record.source,
                "sha256": record.sha256,
                "architecture": record.architecture,
                "n_outputs": record.n_outputs,
                **dtypes,
                **({"archive_sha256": record.archive_sha256} if record.archive_sha256 else {}),
            },
        )
    assert init.job_id is not None
    try:
        job = job_for(session, tenant, init.job_id, need="read")
    except NotFound:  # as GET /v1/jobs/{id}/model would answer: the same for no such job
        raise NotFound(
            slug="not-found",
            detail="model.init.job_id: no job whose model you may download has this id; a job can start only from "
            "a model its submitter may download (GET /v1/jobs/{id}/model)",
        ) from None
    if job.status != JobStatus.SUCCEEDED or job.model_sha256 is None:
        raise _invalid(f"model.init.job_id: job {job.id} is {job.status}; only a succeeded job's model can be a start")
    start_dataset = session.get(Dataset, job.dataset_id)
    assert start_dataset is not None
    if job.model_blob is None or (start_dataset.status != DatasetStatus.ACTIVE and start_dataset.delete_models):
        raise _invalid(f"model.init.job_id: job {job.id}'s model was deleted with its dataset")
    facts = facts_of(start_dataset)
    return InitSource(
        architecture=job.model_name,
        params=dict(stored_spec(job).model.params),
        input_shape=tuple(start_dataset.feature_shape),
        provenance={
            "kind": "job",
            "job_id": job.id,
            "dataset_id": start_dataset.id,
            "dataset_public": start_dataset.public,
            "sha256": job.model_sha256,
            "architecture": job.model_name,
            "n_outputs": get_model(job.model_name).n_outputs(facts),
            "epsilon": None if start_dataset.public else job.epsilon_committed,
            "delta": None if start_dataset.public else job.delta,
            "classes": dataset_classes(start_dataset),
            **({} if dataset is None else {"chain": resolve_chain(session, job, dataset=dataset)}),
        },
    )


def dataset_classes(dataset: Dataset) -> list[str] | None:
    """The dataset's public class list (index i = output i); None for regression."""
    classes = public_class_list(
        task=dataset.task,
        n_classes=dataset.n_classes,
        class_names=dataset.class_names,
        declared=dataset.classes_declared,
    )
    return None if classes is None else list(classes.names)


def head_is_new(init: InitSource, *, n_outputs: int, classes: list[str] | None) -> bool:
    """Whether the job starts with a fresh head instead of the init's.

    A head's output i means the init dataset's class i: it is reused only when that meaning holds,
    i.e. the class lists are the same, in the same order (a job's model), or, for a base model
    (which records no class names), when the output count is. Otherwise outputs would be scored as
    the wrong classes, and a trained head is a worse start than a fresh one.
    """
    if init.provenance["n_outputs"] != n_outputs:
        return True
    init_classes = init.provenance.get("classes")
    return init_classes is not None and classes is not None and list(init_classes) != list(classes)


def check_init_fits(
    init: InitSource,
    *,
    architecture: str,
    params: dict[str, Any],
    input_shape: tuple[int, ...],
    body_from: frozenset[str] = frozenset(),
) -> None:
    """The new job's architecture, params and input shape must be the init's (the head may differ).
    ``body_from``: other architectures this one starts from (a classifier from a language model of
    the same transformer); then every param the init has must be the job's."""
    if init.architecture != architecture and init.architecture not in body_from:
        also = f" (or one of {sorted(body_from)})" if body_from else ""
        raise _invalid(f"model.init is a '{init.architecture}' model; this job's model is '{architecture}'{also}")
    shared = params if init.architecture == architecture else {k: v for k, v in params.items() if k in init.params}
    if init.params != shared:
        raise _invalid(f"model.params {params} differ from the init's {init.params}; use the same params")
    if init.input_shape != input_shape:
        raise _invalid(
            f"the init takes inputs of shape {list(init.input_shape)}; "
            f"this dataset's rows have shape {list(input_shape)}"
        )
