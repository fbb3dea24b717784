"""What a reader may see of a job's init chain (docs/sharing.md#fine-tuning-from-another-job).

A job's spec and report name the jobs its starting weights descend from. Each of those jobs, and
its dataset, may belong to another tenant: a chain job's id, ε and model hash are shown only to a
reader of that job (the same rule as ``GET /v1/jobs/{id}``), its dataset's id and class list only
to a reader with a role on that dataset (as ``GET /v1/datasets/{id}``), and neither to anyone
else, who learns only that the weights came from elsewhere and whether that is covered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from kernel.access.roles import relation_to, role_on
from kernel.db.orm import Dataset, Job, Tenant
from kernel.reporting.init_report import Level, chain_positions, provenance_for_viewer
from kernel.schemas.stored_spec import StoredJobSpec


def link_level(session: Session, tenant: Tenant, *, job_id: str | None, dataset_id: str | None) -> Level:
    """``job`` if the reader may read the chain job, ``dataset`` if it has a role on its dataset."""
    job = session.get(Job, job_id) if job_id else None
    if job is not None and relation_to(session, tenant, job) is not None:
        return "job"
    dataset = session.get(Dataset, dataset_id) if dataset_id else None
    if dataset is not None and role_on(session, tenant, dataset) is not None:
        return "dataset"
    return "none"


def chain_levels(session: Session, tenant: Tenant, init: Mapping[str, Any] | None) -> dict[int, Level]:
    """The reader's level for each position of a provenance's or a report section's chain."""
    return {
        position: link_level(session, tenant, job_id=job_id, dataset_id=dataset_id)
        for position, (job_id, dataset_id) in chain_positions(init).items()
    }


def _shown(spec: StoredJobSpec, levels: Mapping[int, Level]) -> dict[str, Any]:
    """One (job or tuning candidate) spec with its provenance, and the start its request named, redacted."""
    shown = spec.to_json()
    if spec.init is not None:
        shown["init"] = provenance_for_viewer(spec.init.to_json(), levels)
    requested = spec.model.init
    if requested is not None and requested.job_id is not None and levels.get(1, "none") != "job":
        hidden = requested.model_copy(update={"job_id": None})
        shown["model"] = spec.model.model_copy(update={"init": hidden}).to_json()
    return shown


LevelCache = dict[tuple[tuple[int, tuple[str | None, str | None]], ...], dict[int, Level]]
"""Levels already looked up for a chain, by its (position, (job id, dataset id)) items."""


def spec_for_viewer(
    session: Session, tenant: Tenant, spec: StoredJobSpec, *, cache: LevelCache | None = None
) -> dict[str, Any]:
    """A job's spec as the reader may see it: its ``init`` (and each tuning candidate's) redacted.
    ``cache``: shared by the jobs of one listing, whose chains often repeat."""
    known: LevelCache = {} if cache is None else cache

    def levels_of(init: Mapping[str, Any]) -> dict[int, Level]:  # a tuning's candidates share one init
        key = tuple(sorted(chain_positions(init).items()))
        if key not in known:
            known[key] = chain_levels(session, tenant, init)
        return known[key]

    def shown(one: StoredJobSpec) -> dict[str, Any]:
        return one.to_json() if one.init is None else _shown(one, levels_of(one.init.to_json()))

    visible = shown(spec)
    if spec.tuning is not None and spec.tuning.candidates:
        candidates = [
            {**candidate.to_json(exclude={"spec"}), "spec": shown(candidate.spec)}
            for candidate in spec.tuning.candidates
        ]
        visible["tuning"] = {**spec.tuning.to_json(exclude={"candidates"}), "candidates": candidates}
    return visible
