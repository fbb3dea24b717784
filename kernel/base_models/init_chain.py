"""The init chain of a job: every job whose model its starting weights descend from.

A job may start from another job's released model (``model.init.job_id``), which may itself have
started from another job's, and so on. Each of those jobs trained on some dataset, and the weights
this job starts from are a function of all of their releases. So the released model of this job is,
for each dataset in the chain, post-processing of every chain job's release on that dataset:

* chain jobs on **this** dataset (or on a dataset with the same content and privacy unit) used the
  same rows again: this job's guarantee is the *composition* of their committed events with its
  own (docs/privacy-model.md#init-chain). The ledger already charged each of them when they ran;
  nothing is charged again;
* chain jobs on **another** private dataset give this model that dataset's composed guarantee;
* chain jobs on a **public** dataset give none and need none.

The chain is resolved once, at estimate and submission (every chain job has succeeded, so its
committed event is final), and stored in the job's spec as ``init.chain``: a report written later
does not depend on rows that could change or go away. Whether a reader may see a link's ids, ε and
hash is decided when it is shown (kernel/reporting/init_visibility.py).
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.datasets.facts import public_class_list
from kernel.db.orm import Dataset, Job, LedgerEntry
from kernel.jobs.status import JobStatus
from kernel.ledger.operations import COMMIT
from kernel.schemas.stored_spec import BaseModelStart, DataRelation, JobStart, stored_spec

COMPOSES_WITH_THIS_DATASET: Final[frozenset[str]] = frozenset({"this-dataset", "same-content"})
"""Relations whose events are the same rows under the same privacy unit: composed into the guarantee."""

MAX_CHAIN_LENGTH: Final[int] = 1000
"""A chain is acyclic by construction (a start must have succeeded before its successor was
submitted); the cap only bounds the walk should a row ever say otherwise."""


def same_content(a: Dataset, b: Dataset) -> bool:
    """Whether two registered datasets hold the same rows as far as the service can tell: the same
    uploaded bytes (docs/privacy-model.md#one-content-one-budget). Rows re-encoded into other bytes
    are not recognised; keeping them under one budget is the owner's duty."""
    return a.id == b.id or (bool(a.sha256) and a.sha256 == b.sha256)


def data_relation(chain_dataset: Dataset, dataset: Dataset) -> DataRelation:
    """What the chain job's dataset is to the new job's ``dataset``."""
    if chain_dataset.public:
        return "public-dataset"
    if chain_dataset.id == dataset.id:
        return "this-dataset"
    if not dataset.public and same_content(chain_dataset, dataset):
        if chain_dataset.privacy_unit_column == dataset.privacy_unit_column:
            return "same-content"
        return "same-content-other-unit"
    return "other-dataset"


def committed_event(session: Session, job: Job) -> dict[str, Any] | None:
    """The event the job's COMMIT entry charged (what it ran); None on a public dataset (no ledger)."""
    entry = session.scalar(
        select(LedgerEntry).where(LedgerEntry.job_id == job.id, LedgerEntry.kind == COMMIT).order_by(LedgerEntry.seq)
    )
    return None if entry is None else entry.event


def _classes(dataset: Dataset) -> list[str] | None:
    classes = public_class_list(
        task=dataset.task,
        n_classes=dataset.n_classes,
        class_names=dataset.class_names,
        declared=dataset.classes_declared,
    )
    return None if classes is None else list(classes.names)


def chain_link(
    session: Session, job: Job, chain_dataset: Dataset, *, dataset: Dataset, position: int
) -> dict[str, Any]:
    """One chain job as stored in ``init.chain`` (position 1: the job this one starts from)."""
    private = not chain_dataset.public
    return {
        "position": position,
        "job_id": job.id,
        "dataset_id": chain_dataset.id,
        "dataset_public": chain_dataset.public,
        "data": data_relation(chain_dataset, dataset),
        "privacy_unit_column": chain_dataset.privacy_unit_column,
        "algorithm": job.algorithm,
        "sha256": job.model_sha256,
        "classes": _classes(chain_dataset),
        "epsilon": job.epsilon_committed if private else None,
        "delta": job.delta if private else None,
        "epsilon_prv": job.epsilon_prv if private else None,
        "event": committed_event(session, job) if private else None,
    }


def _origin(init: BaseModelStart | None) -> dict[str, Any]:
    """Where the deepest chain job's weights started: a base model (as its provenance recorded it
    at that job's submission), or a fresh, data-independent initialisation."""
    if init is None:
        return {"kind": "fresh"}
    return {
        "kind": "base-model",
        "base_model_id": init.base_model_id,
        "name": init.name,
        "source": init.source,
        "sha256": init.sha256,
    }


def _group(chain_dataset: Dataset, earlier: list[Dataset], *, dataset: Dataset) -> str:
    """The id naming the rows a link trained on: this dataset's for links that compose with it,
    else the first chain dataset (in chain order) with the same content and privacy unit, so that
    jobs on byte-identical copies are composed together, as the same rows must be."""
    if data_relation(chain_dataset, dataset) in COMPOSES_WITH_THIS_DATASET:
        return dataset.id
    for other in earlier:
        if same_content(other, chain_dataset) and other.privacy_unit_column == chain_dataset.privacy_unit_column:
            return other.id
    return chain_dataset.id


def resolve_chain(session: Session, start: Job, *, dataset: Dataset) -> dict[str, Any]:
    """``{"links": [...], "origin": {...}}`` for a job on ``dataset`` that starts from ``start``.

    Walks ``spec.init.job_id`` from job to job through the stored rows (older jobs' specs hold no
    chain of their own). A link whose job or dataset row is missing, or did not succeed, ends the
    walk with an ``unavailable`` origin: the report then says that the chain could not be followed
    beyond it, rather than pretending it ended there."""
    links: list[dict[str, Any]] = []
    datasets: list[Dataset] = []
    job: Job | None = start
    seen: set[str] = set()
    while job is not None and len(links) < MAX_CHAIN_LENGTH:
        chain_dataset = session.get(Dataset, job.dataset_id)
        if chain_dataset is None or job.status != JobStatus.SUCCEEDED or job.id in seen:
            return {"links": links, "origin": {"kind": "unavailable", "job_id": job.id}}
        seen.add(job.id)
        link = chain_link(session, job, chain_dataset, dataset=dataset, position=len(links) + 1)
        link["group"] = None if chain_dataset.public else _group(chain_dataset, datasets, dataset=dataset)
        links.append(link)
        datasets.append(chain_dataset)
        init = stored_spec(job).init
        if not isinstance(init, JobStart):
            return {"links": links, "origin": _origin(init)}
        job = session.get(Job, init.job_id)
        if job is None:
            return {"links": links, "origin": {"kind": "unavailable", "job_id": init.job_id}}
    return {"links": links, "origin": {"kind": "unavailable", "job_id": None if job is None else job.id}}
