"""The privacy report of a job that ended without succeeding after it had committed ε.

Every ε spent has a report (docs/reports-and-dashboard.md#jobs-that-did-not-succeed). A job
cancelled while running commits the steps it ran; one that failed after a worker opened the data
(its worker lost on its last attempt included), or was cancelled after a lost attempt, commits its
whole reservation. None releases a model or a metric. Its report states what it committed and why
it ended, with the same ledger view (before, this job's charge, after) as a success's.

It is built in the lifecycle transaction that commits the charge (kernel.jobs.lifecycle), app-side
and torch-free, because the reconciler settles lost jobs where there is no worker. What takes
time (re-deriving the plan, the single-job ε) is computed before that transaction
(:func:`ended_report_inputs`) for the event the caller expects to be committed; only if another
event is committed after all (a race with another transition) is it computed under the lock, from
the closed forms, which are bounded in time.

A private tuning's report states no number of trials, no steps and no durations: those would
count its trials, whose number must stay secret. It keeps to the committed event (a tuning
commits its whole reservation however it ends) and the tuning's public facts.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import object_session

from algorithms import get_algorithm
from kernel import privacy
from kernel.db.orm import Dataset, Job, LedgerEntry
from kernel.ingest.preparation import preparation_report
from kernel.jobs.lifecycle import CommitRecord, EndedReport
from kernel.jobs.planning import RebuiltJob, rebuild_job
from kernel.jobs.status import JobStatus
from kernel.ledger.budget_change import AFTER_DEFINITION, BEFORE_DEFINITION, job_charge
from kernel.ledger.operations import curve_epsilon
from kernel.reporting.init_report import init_section
from kernel.reporting.privacy_report import (
    CLIPPING_CAVEAT,
    COMMON_CAVEATS,
    NOISE_SOURCE,
    NORMALISATION,
    OBSERVED_CLASSES_CAVEAT,
    REPORT_VERSION,
    budget_raise_caveat,
    closed_form_single_job_epsilon,
    dataset_section,
    noise_caveat,
    sensitivity_fields,
    single_job_fields,
)
from kernel.reporting.privacy_unit import privacy_unit_section, row_count_caveat
from kernel.reporting.tuning import tuning_section
from kernel.schemas.stored_spec import stored_spec
from privtrain_common.directed_rounding import format_guarantee

__all__ = [
    "EndedReportInputs",
    "EndedReportWriter",
    "build_ended_report",
    "cancel_report_writer",
    "ended_report_inputs",
    "reservation_report_writer",
]

log = logging.getLogger("privtrain.reporting")

NO_RELEASE_CAVEAT = (
    "This job released no model and no metric. Its guarantee covers what it did make public (its "
    "status, the steps it reported running, its events), for one privacy unit of this dataset (see "
    "privacy_unit) under add/remove neighbours; it does not cover choices made outside the service "
    "(for example hyperparameters tuned on the same data in earlier jobs are covered only insofar as "
    "those jobs were also charged to this ledger)."
)

ENDED_TUNING_CAVEAT = (
    "This job was a private hyperparameter tuning that ended without releasing anything. It ran a "
    "secret random number of trials (possibly none), each a configuration drawn at random from the "
    "public pool below; its charge (the ledger ε above) is its whole reservation, Papernot and "
    "Steinke's bound over that pool, committed however a tuning ends. This report states no number "
    "of trials, no steps and no durations: they would tell how many trials it drew."
)

UNKNOWN_NOISE_MODE = "not known: the job was settled without the worker that ran it"


@dataclass(frozen=True)
class MechanismFacts:
    """The public constants of the job's mechanism, from its re-derived plan."""

    sampling: str
    expected_batch_size: float
    sensitivity: float
    sensitivity_norm: str


@dataclass(frozen=True)
class EndedReportInputs:
    """What the report needs besides the ledger, computed before the transaction that commits."""

    dataset: Dataset
    committed_event: dict[str, Any]
    """The event the caller expects the transition to commit (the steps run, or the reservation)."""
    single_job: privacy.SingleJobEpsilon
    """The single-job ε of ``committed_event``."""
    mechanism: MechanismFacts | None
    algorithm_notes: dict[str, Any] = field(default_factory=dict)
    mechanism_unavailable: str | None = None
    """Why ``mechanism`` is None (a tuning, or a plan that could not be re-derived)."""
    secure_gaussian: bool | None = None
    """Whether the worker drew Gaussians in secure mode; None when no worker settled the job."""


def _is_tuning(job: Job) -> bool:
    return stored_spec(job).is_tuning


def ended_report_inputs(
    job: Job,
    dataset: Dataset,
    *,
    committed_event: dict[str, Any] | None = None,
    single_job: privacy.SingleJobEpsilon | None = None,
    secure_gaussian: bool | None = None,
    rebuilt: RebuiltJob | None = None,
) -> EndedReportInputs:
    """The inputs for ``committed_event`` (default: the job's whole reservation, ``job.event``).

    ``single_job``: the caller's (a worker computes the numeric one for the steps a cancelled job
    ran); default the closed forms. ``rebuilt``: the job's plan as the worker re-derived it;
    default re-derived here from the stored spec. Both can take a while: call this outside any
    write transaction."""
    event = dict(job.event if committed_event is None else committed_event)
    if single_job is None:
        single_job = closed_form_single_job_epsilon(event, delta=job.delta, algorithm=job.algorithm)
    if _is_tuning(job):
        return EndedReportInputs(
            dataset=dataset,
            committed_event=event,
            single_job=single_job,
            mechanism=None,
            mechanism_unavailable="a tuning's trials ran configurations of its pool: see tuning",
            secure_gaussian=secure_gaussian,
        )
    try:
        rebuilt = rebuilt or rebuild_job(job.spec, job.algorithm, dataset)
        plan = rebuilt.plan
        mechanism = MechanismFacts(
            sampling=plan.sampling,
            expected_batch_size=plan.expected_batch_size,
            sensitivity=plan.sensitivity,
            sensitivity_norm=plan.sensitivity_norm,
        )
        notes = get_algorithm(job.algorithm).report_notes(
            rebuilt.hyperparameters, plan, noise_multiplier=job.noise_multiplier, delta=job.delta
        )
    except Exception as exc:  # noqa: BLE001 - the charge is in the event; only the plan's constants are missing
        log.warning("could not re-derive an ended job's plan for its report", extra={"job_id": job.id})
        return EndedReportInputs(
            dataset=dataset,
            committed_event=event,
            single_job=single_job,
            mechanism=None,
            mechanism_unavailable=f"the job's plan could not be re-derived from its spec ({type(exc).__name__})",
            secure_gaussian=secure_gaussian,
        )
    return EndedReportInputs(
        dataset=dataset,
        committed_event=event,
        single_job=single_job,
        mechanism=mechanism,
        algorithm_notes=notes,
        secure_gaussian=secure_gaussian,
    )


@dataclass(frozen=True)
class EndedReportWriter:
    """An ``kernel.jobs.lifecycle.EndedReportWriter``: builds the report of the commit it is given
    (the lifecycle stages it like a success's). ``inputs``: prepared for the event the caller
    expects to be committed, or None when it expects none (then, as after a race that committed
    another event, they are computed when needed, from the closed forms)."""

    inputs: EndedReportInputs | None = None
    secure_gaussian: bool | None = None

    def __call__(self, record: CommitRecord) -> EndedReport:
        assert record.commit_entry is not None and record.commit_entry.event is not None
        inputs = self.inputs
        if inputs is None or inputs.committed_event != record.commit_entry.event:
            inputs = self._inputs_under_the_lock(record)
        report = build_ended_report(record=record, inputs=inputs)
        return EndedReport(report=report, single_job_epsilon=inputs.single_job.epsilon)

    def _inputs_under_the_lock(self, record: CommitRecord) -> EndedReportInputs:
        job = record.job
        log.warning("computing an ended job's report inputs inside its transaction", extra={"job_id": job.id})
        session = object_session(job)
        dataset = session.get(Dataset, job.dataset_id) if session is not None else None
        if dataset is None:
            raise RuntimeError(f"job {job.id}: its dataset is not readable in the settling transaction")
        assert record.commit_entry is not None and record.commit_entry.event is not None
        return ended_report_inputs(
            job, dataset, committed_event=record.commit_entry.event, secure_gaussian=self.secure_gaussian
        )


def reservation_report_writer(
    job: Job | None, dataset: Dataset | None, *, commits_reservation: bool
) -> EndedReportWriter | None:
    """The writer for a transition that may commit ``job``'s whole reservation (a refused retry, a
    lost worker, a cancel). None on a public dataset (no ledger, no report). When the caller
    expects the reservation to be committed, the inputs are prepared now, before the settling
    transaction; otherwise (or if preparing them fails) they are computed under the lock only if
    it commits after all, from the closed forms."""
    if dataset is None or dataset.public:
        return None
    if job is None or not commits_reservation:
        return EndedReportWriter()
    try:
        return EndedReportWriter(ended_report_inputs(job, dataset))
    except Exception:
        log.exception("could not prepare an ended job's report", extra={"job_id": job.id})
        return EndedReportWriter()


def cancel_report_writer(job: Job, dataset: Dataset | None) -> EndedReportWriter | None:
    """The writer a cancel passes to ``kernel.jobs.lifecycle.cancel``. A cancel commits a queued job
    that a lost attempt had touched, and a running tuning, each its whole reservation: their inputs
    are prepared for that case; another running job is only asked to stop (its worker settles it),
    a fresh one is released."""
    commits_now = (job.status == JobStatus.QUEUED and job.touched_at is not None) or (
        job.status == JobStatus.RUNNING and _is_tuning(job)
    )
    return reservation_report_writer(job, dataset, commits_reservation=commits_now)


# ---------------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class _Ending:
    """How the job ended, in the report's words."""

    charged: str
    """"steps-run" (what ran was committed) or "whole-reservation"."""
    sentence: str


def _units(notes: dict[str, Any]) -> str:
    return "budget units" if "steps_are_budget_units" in notes else "steps"


def _ending(job: Job, entry: LedgerEntry, inputs: EndedReportInputs) -> _Ending:
    whole = inputs.committed_event == job.event
    charged = "whole-reservation" if whole else "steps-run"
    if _is_tuning(job):
        return _Ending(
            charged,
            f"This private hyperparameter tuning ended ({job.status}) without releasing a model: a tuning "
            "commits its whole reservation however it ends",
        )
    units = _units(inputs.algorithm_notes)
    reason = str(entry.details.get("reason", ""))
    if not whole:
        return _Ending(
            charged,
            f"It was cancelled while running, after {job.steps_run} of {job.steps_planned} {units}: it committed "
            f"the ε of the {units} it ran (it had reserved ε {format_guarantee(job.epsilon_ledger)}), and the rest "
            "of its reservation went back to the budget",
        )
    if reason == "cancelled after a lost attempt":
        return _Ending(
            charged,
            "It was cancelled while waiting for another attempt, after a worker that had opened the data was "
            "lost: what the lost attempt ran is not known exactly, so its whole reservation was committed",
        )
    if job.error_code == "worker-lost":
        return _Ending(
            charged,
            "Its worker was lost on its last attempt (worker-lost) after opening the data: what it ran is not "
            "known exactly, so its whole reservation was committed",
        )
    return _Ending(
        charged,
        f"It failed ({job.error_code}) after a worker had opened the data: what the failed attempt ran is not "
        "known exactly, so its whole reservation was committed",
    )


def _outcome(job: Job, ending: _Ending) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "status": job.status,
        "charged": ending.charged,
        "model_released": False,
        "metrics_released": False,
        "statement": f"{ending.sentence}. No model and no metric were released.",
    }
    if not _is_tuning(job):  # a tuning's error code could tell how many trials it drew
        outcome["error_code"] = job.error_code
    return outcome


def _mechanism(job: Job, inputs: EndedReportInputs, ending: _Ending) -> dict[str, Any] | None:
    facts = inputs.mechanism
    if facts is None:
        return None
    return {
        "sampling": facts.sampling,
        "sampling_probability": job.sampling_probability,
        "expected_batch_size": facts.expected_batch_size,
        "noise_multiplier": job.noise_multiplier,
        **sensitivity_fields(facts.sensitivity, facts.sensitivity_norm, job.noise_multiplier),
        "normalisation": NORMALISATION.get(facts.sampling, "by public constants only (see the algorithm's notes)"),
        "steps_planned": job.steps_planned,
        "steps_run": job.steps_run,
        "steps_charged": job.steps_planned if ending.charged == "whole-reservation" else job.steps_run,
    }


def _charge(job: Job, record: CommitRecord, curve: tuple[float, ...], committed: float) -> dict[str, Any]:
    assert record.commit_entry is not None
    charge = job_charge(
        committed_epsilon=committed,
        reserved_epsilon=job.epsilon_ledger,
        curve=curve,
        orders=privacy.ORDERS,
        orders_version=privacy.ORDERS_VERSION,
        steps_run=job.steps_run,
        steps_planned=job.steps_planned,
        commit_entry=record.commit_entry,
    )
    # released iff the COMMIT was less than the reservation (a failure commits it whole, whatever ran)
    charge["rest_of_reservation_released"] = record.commit_entry.event != job.event
    if _is_tuning(job):
        del charge["steps_run"], charge["steps_planned"]
    return charge


def _caveats(job: Job, inputs: EndedReportInputs, adjustments: list[dict[str, Any]]) -> list[str]:
    caveats = [NO_RELEASE_CAVEAT, *COMMON_CAVEATS]
    if inputs.secure_gaussian is not None:
        caveats.append(noise_caveat(secure_gaussian=inputs.secure_gaussian))
    if adjustments:
        caveats.insert(0, budget_raise_caveat(adjustments))
    dataset = inputs.dataset
    if not dataset.classes_declared and dataset.task == "classification":
        caveats.append(OBSERVED_CLASSES_CAVEAT)
    unit_caveat = row_count_caveat(dataset)
    if unit_caveat is not None:
        caveats.append(unit_caveat)
    if get_algorithm(job.algorithm).clips_per_sample:
        caveats.append(CLIPPING_CAVEAT)
    if _is_tuning(job):
        caveats.insert(0, ENDED_TUNING_CAVEAT)
    return caveats


def build_ended_report(*, record: CommitRecord, inputs: EndedReportInputs) -> dict[str, Any]:
    """The report of ``record``'s job, which ended (its status and error code set) without success
    after committing ``record.commit_entry``. Same layout as a success's report
    (kernel.reporting.privacy_report.build_report), plus ``outcome``; no model, no metrics."""
    job, entry = record.job, record.commit_entry
    assert entry is not None and record.budget_before is not None and record.budget_after is not None
    dataset = inputs.dataset
    event = privacy.event_from_json(inputs.committed_event)
    curve = privacy.rdp_curve(event)
    eps_rdp, order = privacy.epsilon_from_rdp(curve, job.delta)
    committed = curve_epsilon(curve, job.delta)  # what kernel.ledger.operations.commit recorded on the job
    spec = stored_spec(job)
    unit = privacy_unit_section(dataset, spec.training.to_json())
    ending = _ending(job, entry, inputs)
    guarantee = (
        f"({format_guarantee(committed)}, {format_guarantee(job.delta)})-differential privacy for "
        f"{unit.pop('guarantee_unit')}: the ε this job committed to the dataset's ledger. {ending.sentence}. "
        "No model and no metric were released"
    )
    report: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "job_id": job.id,
        "status": job.status,
        "outcome": _outcome(job, ending),
        "dataset": dataset_section(dataset),
        "preparation": preparation_report(dataset.preparation),
        **unit,
        "guarantee": guarantee,
        "model": {"name": job.model_name, "params": spec.model.params, "released": False, "sha256": None},
        "algorithm": {
            "name": job.algorithm,
            "hyperparameters": spec.algorithm.hyperparameters,
            "training": spec.training.to_json(),
            "notes": inputs.algorithm_notes,
        },
        "mechanism": _mechanism(job, inputs, ending),
        "event": inputs.committed_event,
        "reserved_event": job.event,
        "epsilon": {
            "delta": job.delta,
            "ledger": committed,
            "ledger_definition": "RDP curve converted at δ/|orders| (the ledger's currency) of the "
            "event this job committed",
            "reserved": job.epsilon_ledger,
            "rdp_at_delta": eps_rdp,
            "rdp_best_order": order,
            **single_job_fields(inputs.single_job),
        },
        "noise": {
            **NOISE_SOURCE,
            "gaussian_secure_mode": UNKNOWN_NOISE_MODE if inputs.secure_gaussian is None else inputs.secure_gaussian,
        },
        "rdp_curve": {"orders": list(privacy.ORDERS), "values": list(curve), "orders_version": privacy.ORDERS_VERSION},
        "accountant": {"name": privacy.ACCOUNTANT_NAME, "version": privacy.ACCOUNTANT_VERSION},
        "released_metrics": None,
        "ledger": {
            "before": record.budget_before,
            "before_definition": BEFORE_DEFINITION.format(before_seq=entry.seq - 1),
            "charge": _charge(job, record, curve, committed),
            "after": record.budget_after,
            "after_definition": AFTER_DEFINITION.format(after_seq=record.budget_after.get("entries", entry.seq)),
            "commit_entry_seq": entry.seq,
            "commit_entry_hash": entry.hash,
            "budget_adjustments": record.adjustments,
        },
        "caveats": _caveats(job, inputs, record.adjustments),
    }
    if inputs.mechanism_unavailable is not None:
        report["mechanism_unavailable"] = inputs.mechanism_unavailable
    if spec.init is not None:  # where the weights started (no model released: nothing composes)
        report["init"] = init_section(spec.init.to_json(), privacy_unit_column=inputs.dataset.privacy_unit_column)
    if spec.tuning is not None:
        report["tuning"] = tuning_section(spec.tuning.to_json(), metrics=None)
    return report
