"""Ledger entries in words, one explainer per entry kind.

Why: a RELEASE entry with a curve reads like a second charge to anyone who has not read the
privacy model; it is the opposite (budget given back). Every ε here is rounded up (a guarantee or
a spend, never a remaining budget) and computed at the job's δ, as the job's own views show it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernel.db.orm import Job, LedgerEntry
from kernel.jobs.status import JobStatus
from kernel.ledger import operations as ledger
from privtrain_common.directed_rounding import format_guarantee

UNUSED_PART_REASON = "unused part of the reservation"
"""``details.reason`` of the RELEASE that :func:`kernel.ledger.operations.commit` appends after a COMMIT."""


@dataclass(frozen=True)
class EntryFacts:
    """What an explainer may read: the entry's public fields and its job's row, if known."""

    kind: str
    job_id: str | None
    curve: Sequence[float] | None
    details: Mapping[str, Any]
    job: Job | None
    delta: float  # the δ at which ε is stated: the job's, else the dataset's


def _job_name(facts: EntryFacts) -> str:
    return f"job {facts.job_id}" if facts.job_id else "a job"


def _epsilon(facts: EntryFacts) -> str:
    value = ledger.curve_epsilon(facts.curve, facts.delta) if facts.curve is not None else 0.0
    return f"ε {format_guarantee(value)} (at δ {format_guarantee(facts.delta)})"


def _steps(facts: EntryFacts, steps_run: object) -> str:
    planned = facts.job.steps_planned if facts.job is not None else None
    if planned is None:
        return f"{steps_run} steps"
    return f"{steps_run} of {planned} steps"


def _reserve(facts: EntryFacts) -> str:
    return (
        f"reserved {_epsilon(facts)} for {_job_name(facts)} before it ran: its worst case, held "
        "against the budget until the job ends"
    )


def _touch(facts: EntryFacts) -> str:
    attempt = facts.details.get("attempt")
    which = f" (attempt {attempt})" if attempt is not None else ""
    return (
        f"a worker opened the data for {_job_name(facts)}{which}: from here on the job pays for "
        "what it runs, even if it fails"
    )


def _commit(facts: EntryFacts) -> str:
    steps_run = facts.details.get("steps_run", facts.job.steps_run if facts.job is not None else "?")
    reason = facts.details.get("reason")
    why = f" ({reason})" if reason else ""
    return f"{_job_name(facts)} ran {_steps(facts, steps_run)} and committed {_epsilon(facts)}{why}"


def _how_the_job_ended(job: Job | None) -> str:
    if job is None:
        return "ended before using all of it"
    ran = f"{job.steps_run} of {job.steps_planned} steps"
    endings: dict[str, str] = {
        JobStatus.SUCCEEDED: f"stopped after {ran}" if job.steps_run < job.steps_planned else "finished",
        JobStatus.CANCELLED: f"was cancelled after {ran}",
        JobStatus.FAILED: f"failed ({job.error_code}) after {ran}",
    }
    return endings.get(job.status, f"ran {ran}")


def _release(facts: EntryFacts) -> str:
    reason = str(facts.details.get("reason", ""))
    name = _job_name(facts)
    if reason == UNUSED_PART_REASON:
        return (
            f"the unused part of {name}'s reservation was returned to the budget (the job "
            f"{_how_the_job_ended(facts.job)}; it was charged only what its COMMIT says)"
        )
    return (
        f"the whole of {name}'s reservation was returned to the budget (the job ended before any "
        f"worker opened the data: {reason or 'released'}); the job spent nothing"
    )


def _adjust(facts: EntryFacts) -> str:
    """Without the actor: analysts see ADJUST rows in their report, and the entry's actor field
    (owner only, in the ledger API) already names who raised it."""
    d = facts.details
    reason = d.get("reason")
    why = f": {reason}" if reason else ""
    return (
        f"the owner raised the budget from ε {format_guarantee(d.get('epsilon_from'))}, "
        f"δ {format_guarantee(d.get('delta_from'))} to ε {format_guarantee(d.get('epsilon_to'))}, "
        f"δ {format_guarantee(d.get('delta_to'))}{why}"
    )


EXPLAINERS: dict[str, Callable[[EntryFacts], str]] = {
    ledger.RESERVE: _reserve,
    ledger.TOUCH: _touch,
    ledger.COMMIT: _commit,
    ledger.RELEASE: _release,
    ledger.ADJUST: _adjust,
}


def explain_entry(
    *,
    kind: str,
    job_id: str | None,
    curve: Sequence[float] | None,
    details: Mapping[str, Any],
    job: Job | None,
    dataset_delta: float,
) -> str:
    """One sentence saying what the entry did to the budget (an unknown kind says so)."""
    facts = EntryFacts(
        kind=kind,
        job_id=job_id,
        curve=curve,
        details=details,
        job=job,
        delta=job.delta if job is not None else dataset_delta,
    )
    explainer = EXPLAINERS.get(kind)
    return explainer(facts) if explainer is not None else f"a {kind} entry"


def jobs_of(session: Session, entries: Sequence[LedgerEntry]) -> dict[str, Job]:
    """The job rows the entries name, in one query."""
    job_ids = {e.job_id for e in entries if e.job_id}
    if not job_ids:
        return {}
    return {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(job_ids)))}


def explain_entries(entries: Sequence[LedgerEntry], *, jobs: Mapping[str, Job], dataset_delta: float) -> list[str]:
    """:func:`explain_entry` for each entry, in order."""
    return [
        explain_entry(
            kind=e.kind,
            job_id=e.job_id,
            curve=e.curve,
            details=e.details or {},
            job=jobs.get(e.job_id) if e.job_id else None,
            dataset_delta=dataset_delta,
        )
        for e in entries
    ]
