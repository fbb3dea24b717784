"""The privacy report of a finished job (docs/privacy-model.md §7): everything an auditor needs."""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any

from algorithms import get_algorithm
from kernel import privacy
from kernel.datasets.facts import public_class_list
from kernel.db.orm import Dataset, Job, LedgerEntry
from kernel.ingest.preparation import preparation_report
from kernel.jobs.status import JobStatus
from kernel.ledger.budget_change import AFTER_DEFINITION, BEFORE_DEFINITION, job_charge
from kernel.ledger.operations import curve_epsilon
from kernel.reporting.privacy_unit import privacy_unit_section, row_count_caveat
from kernel.schemas.renamed import ALIASES_REMOVED_IN
from kernel.schemas.stored_spec import stored_spec
from privtrain_common.directed_rounding import format_guarantee

REPORT_VERSION = 1

RELEASED_MODEL_CAVEAT = (
    "The guarantee covers the released model only, for one privacy unit of this dataset (see "
    "privacy_unit) under add/remove neighbours; it does not cover choices made outside the service "
    "(for example hyperparameters tuned on the same data in earlier jobs are covered only insofar "
    "as those jobs were also charged to this ledger)."
)

COMMON_CAVEATS = (
    "The ledger ε is derived from the Rényi-DP curve on a fixed order grid and is what the budget "
    "is charged. The single-job ε (epsilon.single_job, with the method that produced it in "
    "single_job_method) is the smallest valid bound of several methods for this job alone; it is "
    "not used by the ledger, because PRV/PLD bounds of adaptively composed jobs are not a valid "
    "filter.",
    "Public by design: the row count n (with a privacy unit column: the number of units, and the row count "
    "only as a caveat below says), the feature shape and names, "
    "the task and the class list, "
    "as the owner declared them at upload. The content hash and the byte size are exact functions "
    "of the rows: only the dataset's owner sees them.",
)
"""The caveats of every private job's report, whether or not it released a model."""

CAVEATS = (RELEASED_MODEL_CAVEAT, *COMMON_CAVEATS)

NOISE_SOURCE = {
    "stream": "per job, at least 128 secret bits from the operating system's CSPRNG: NumPy Philox "
    "with a 256-bit seed on the CPU, two independently keyed Philox generators on CUDA; the state "
    "never leaves the worker",
    "laplace_and_selections": "sampled exactly with integer arithmetic on a power-of-two grid "
    "(discrete Laplace, exact exponential mechanism), the grid's rounding paid for by more noise",
}


PERPLEXITY_CAVEAT = (
    "Perplexity is exp of the released mean token loss (post-processing, no privacy cost). Each held-out "
    "row's mean token loss was clipped to [0, {loss_clip:.4g}] nats before summing, which biases the value "
    "down for a model whose rows exceed the clip, and a row with no target token counted as a loss of 0."
)


def noise_caveat(*, secure_gaussian: bool) -> str:
    """How this job's noise was drawn, and what is not accounted for."""
    gaussian = (
        "Gaussian noise was drawn in secure mode (each value the sum of four draws, halved; Holohan "
        "& Braghin 2021); floating-point effects of the sampler beyond that are not accounted for."
        if secure_gaussian
        else "Gaussian noise was NOT drawn in secure mode (the service's secure_noise setting was off, "
        "which production refuses): floating-point effects of the sampler are not accounted for."
    )
    return (
        "Every privacy-protecting draw (noise, sampling, hold-out coins, selections) came from a "
        "per-job stream with at least 128 secret bits from the operating system's CSPRNG, never "
        "stored outside the worker. Laplace noise and selections were sampled exactly with integer "
        "arithmetic on a power-of-two grid (no Mironov-style floating-point leak), the grid's "
        f"rounding paid for by slightly more noise. {gaussian}"
    )


CLIPPING_CAVEAT = (
    "Per-sample clipping holds in floating point: each row's (or unit's) clipped gradient, as computed, has norm "
    "at most the clipping bound (its norm is accumulated in float64 as an upper bound, and it is clipped to the "
    "bound times 1 − 2⁻²¹), so rounding never exceeds the sensitivity charged (docs/privacy-model.md, 'Clipping in "
    "floating point'). Not accounted for: the float32 rounding of the sum of the batch's clipped gradients, of the "
    "noise addition, and of the forward and backward passes (which may depend on the realised batch), all of the "
    "order of 2⁻²⁴ of the sum."
)


OBSERVED_CLASSES_CAVEAT = (
    "No class list was declared at upload, so the list shown was taken from the labels found: it is "
    "an exact function of the rows, made public when the dataset was registered, and not covered by "
    "this guarantee."
)


def budget_raise_caveat(adjustments: list[dict[str, Any]]) -> str:
    """What a raised budget means: a running total, not a guarantee fixed in advance."""
    seqs = ", ".join(str(a["seq"]) for a in adjustments)
    return (
        f"The owner raised this dataset's budget {len(adjustments)} time(s) (ADJUST entries {seqs}). "
        "Releases admitted before the first raise are covered by the budget in force then, which was "
        "fixed before they ran. For everything since, the budget in force now is a running total of "
        "what the ledger has charged, not a guarantee fixed in advance: a raise decided after seeing "
        "earlier results is itself a choice that depends on the data, and the privacy filter's "
        "theorem assumes a budget chosen beforehand. A bound that stays valid under such raises (a "
        "privacy odometer; Rogers, Roth, Ullman & Vadhan 2016) needs more δ and is not computed here."
    )


NORMALISATION = {
    "poisson": "divided by the public expected batch size q·n",
    "full-batch": "divided by the public registered number of training rows n",
    "disjoint-blocks": "per block, divided by the public expected block size",
}
"""How each sampling scheme's releases are normalised (docs/privacy-model.md §2: public constants only)."""


def _class_list_fields(dataset: Dataset) -> dict[str, Any]:
    """The public class list and whether the owner declared it (docs/privacy-model.md §2)."""
    classes = public_class_list(
        task=dataset.task,
        n_classes=dataset.n_classes,
        class_names=dataset.class_names,
        declared=dataset.classes_declared,
    )
    if classes is None:
        return {}
    return {"classes": list(classes.names), "classes_source": classes.source}


def sensitivity_fields(sensitivity: float, norm: str, noise_multiplier: float) -> dict[str, Any]:
    """Gaussian sums report Δ₂ and the noise std σ·Δ₂ they drew; other mechanisms (exponential
    mechanism scores, Laplace/Peeling in ℓ∞) report Δ with its norm, their noise is in the notes."""
    if norm == "l2":
        return {"l2_sensitivity": sensitivity, "noise_std_on_sum": noise_multiplier * sensitivity}
    return {"sensitivity": sensitivity, "sensitivity_norm": norm}


RENAMED_EPSILON_FIELDS = {"prv_upper_bound": "single_job", "prv_label": "single_job_label"}
"""Deprecated names in a report's epsilon block → their replacements (same values; docs/epsilon.md#renamed-fields).
The number is not always PRV's: it is the smallest of several methods (single_job_method)."""


def single_job_fields(single_job: privacy.SingleJobEpsilon) -> dict[str, Any]:
    """The single-job ε in a report's epsilon block, under its name and its deprecated ones."""
    fields: dict[str, Any] = {
        "single_job": single_job.epsilon,
        "single_job_method": single_job.method,
        "single_job_label": single_job.detail,
    }
    fields |= {old: fields[new] for old, new in RENAMED_EPSILON_FIELDS.items()}
    fields["renamed"] = {**RENAMED_EPSILON_FIELDS, "removed_in": ALIASES_REMOVED_IN}
    return fields


def report_single_job_epsilon(
    actual_event: dict[str, Any], *, delta: float, algorithm: str
) -> privacy.SingleJobEpsilon:
    """The report's single-job ε: numeric accountants in a time- and memory-capped child process,
    the closed forms when it gives up. Slow, so computed before the commit transaction."""
    return privacy.capped_single_job_epsilon(
        privacy.event_from_json(actual_event),
        delta,
        zcdp_is_gaussian=get_algorithm(algorithm).zcdp_leaves_are_gaussian,
    )


def closed_form_single_job_epsilon(event: dict[str, Any], *, delta: float, algorithm: str) -> privacy.SingleJobEpsilon:
    """The single-job ε from the closed forms only (bounded time and memory, no child process): for
    a job that ended without a worker to compute the numeric one (docs/single-job-epsilon.md)."""
    return privacy.single_job_epsilon(
        privacy.event_from_json(event),
        delta,
        zcdp_is_gaussian=get_algorithm(algorithm).zcdp_leaves_are_gaussian,
        numeric=False,
    )


def dataset_section(dataset: Dataset) -> dict[str, Any]:
    """The report's dataset block: its public facts, and its content hash for the owner's copy."""
    return {
        "id": dataset.id,
        "name": dataset.name,
        # The owner's copy only: kernel.reporting.redaction drops it for anyone else.
        "sha256": dataset.sha256,
        "n_rows": dataset.n_rows,
        **({"n_units": dataset.n_units} if dataset.n_units is not None else {}),
        "feature_shape": dataset.feature_shape,
        "task": dataset.task,
        "n_classes": dataset.n_classes,
        **_class_list_fields(dataset),
    }


def build_report(
    *,
    job: Job,
    dataset: Dataset,
    sensitivity: float,
    expected_batch_size: float,
    sampling: str,
    sensitivity_norm: str,
    actual_event: dict[str, Any],
    budget_before: dict[str, Any],
    budget_after: dict[str, Any],
    commit_entry: LedgerEntry,
    adjustments: list[dict[str, Any]],
    metrics: dict[str, Any] | None,
    algorithm_notes: dict[str, Any],
    model_sha256: str,
    secure_gaussian: bool,
    single_job: privacy.SingleJobEpsilon,
) -> dict[str, Any]:
    """``secure_gaussian``: whether the worker that finished the job drew Gaussians in secure mode.
    ``single_job``: :func:`report_single_job_epsilon` of ``actual_event``, computed by the caller
    outside any database transaction (it may be slow). ``budget_before``: the ledger just before
    this job's COMMIT without this job (:func:`kernel.ledger.budget_change.budget_without_job`);
    ``budget_after``: right after it."""
    event = privacy.event_from_json(actual_event)
    caveats = [*CAVEATS, noise_caveat(secure_gaussian=secure_gaussian)]
    if adjustments:
        caveats.insert(0, budget_raise_caveat(adjustments))
    if not dataset.classes_declared and dataset.task == "classification":
        caveats.append(OBSERVED_CLASSES_CAVEAT)
    unit_caveat = row_count_caveat(dataset)
    if unit_caveat is not None:
        caveats.append(unit_caveat)
    if get_algorithm(job.algorithm).clips_per_sample:
        caveats.append(CLIPPING_CAVEAT)
    if metrics is not None:
        caveats.append(
            "The released evaluation metric is noisy by design (its mechanism is stated); the "
            "hold-out rows were chosen by independent per-row coins and not used for training. It "
            "is clamped to the metric's valid range (post-processing, no privacy cost); its interval "
            "is computed from public quantities only."
        )
        if metrics.get("metric") == "perplexity":
            caveats.append(PERPLEXITY_CAVEAT.format(loss_clip=metrics.get("loss_clip")))
    curve = privacy.rdp_curve(event)
    eps_rdp, order = privacy.epsilon_from_rdp(curve, job.delta)
    committed = curve_epsilon(curve, job.delta)  # what kernel.ledger.operations.commit recorded on the job
    spec = stored_spec(job)
    unit = privacy_unit_section(dataset, spec.training.to_json())
    guarantee = (
        f"({format_guarantee(committed)}, {format_guarantee(job.delta)})-differential privacy for "
        f"{unit.pop('guarantee_unit')}: the ε this job committed to the dataset's ledger"
    )
    if job.steps_run < job.steps_planned:
        units = "budget units" if "steps_are_budget_units" in algorithm_notes else "steps"
        guarantee += (
            f". It ran {job.steps_run} of {job.steps_planned} {units}; committed ε "
            f"{format_guarantee(committed)} (it had reserved ε {format_guarantee(job.epsilon_ledger)}), "
            "the rest of the reservation was released"
        )
    return {
        "report_version": REPORT_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "job_id": job.id,
        "status": JobStatus.SUCCEEDED,
        "dataset": dataset_section(dataset),
        "preparation": preparation_report(dataset.preparation),
        **unit,
        "guarantee": guarantee,
        "model": {"name": job.model_name, "params": spec.model.params, "sha256": model_sha256},
        "algorithm": {
            "name": job.algorithm,
            "hyperparameters": spec.algorithm.hyperparameters,
            "training": spec.training.to_json(),
            "notes": algorithm_notes,
        },
        "mechanism": {
            "sampling": sampling,
            "sampling_probability": job.sampling_probability,
            "expected_batch_size": expected_batch_size,
            "noise_multiplier": job.noise_multiplier,
            **sensitivity_fields(sensitivity, sensitivity_norm, job.noise_multiplier),
            "normalisation": NORMALISATION.get(sampling, "by public constants only (see the algorithm's notes)"),
            "steps_planned": job.steps_planned,
            "steps_run": job.steps_run,
        },
        "event": actual_event,
        "reserved_event": job.event,
        "epsilon": {
            "delta": job.delta,
            "ledger": committed,
            "ledger_definition": "RDP curve converted at δ/|orders| (the ledger's currency) of the "
            "event this job ran: what it committed",
            "reserved": job.epsilon_ledger,
            "rdp_at_delta": eps_rdp,
            "rdp_best_order": order,
            **single_job_fields(single_job),
        },
        "noise": {**NOISE_SOURCE, "gaussian_secure_mode": secure_gaussian},
        "rdp_curve": {"orders": list(privacy.ORDERS), "values": list(curve), "orders_version": privacy.ORDERS_VERSION},
        "accountant": {"name": privacy.ACCOUNTANT_NAME, "version": privacy.ACCOUNTANT_VERSION},
        "released_metrics": metrics,
        **_generation_fields(dataset, private=True),
        "ledger": {
            "before": budget_before,
            "before_definition": BEFORE_DEFINITION.format(before_seq=commit_entry.seq - 1),
            "charge": job_charge(
                committed_epsilon=committed,
                reserved_epsilon=job.epsilon_ledger,
                curve=curve,
                orders=privacy.ORDERS,
                orders_version=privacy.ORDERS_VERSION,
                steps_run=job.steps_run,
                steps_planned=job.steps_planned,
                commit_entry=commit_entry,
            ),
            "after": budget_after,
            "after_definition": AFTER_DEFINITION.format(after_seq=budget_after.get("entries", commit_entry.seq)),
            "commit_entry_seq": commit_entry.seq,
            "commit_entry_hash": commit_entry.hash,
            "budget_adjustments": adjustments,
        },
        "caveats": caveats,
    }


PUBLIC_DATASET_GUARANTEE = (
    "trained on a dataset its owner declared public: no differential privacy guarantee is given or needed"
)


def build_public_report(
    *,
    job: Job,
    dataset: Dataset,
    expected_batch_size: float,
    sampling: str,
    metrics: dict[str, Any] | None,
    model_sha256: str,
) -> dict[str, Any]:
    """The report of a job on a public dataset: what ran, and plainly that no guarantee is given.

    No ε, no privacy event and no ledger block: the dataset has no budget, and a number would read
    as a guarantee that nothing here provides (docs/pretraining-and-finetuning.md)."""
    spec = stored_spec(job)
    return {
        "report_version": REPORT_VERSION,
        "generated_at": dt.datetime.now(dt.UTC).isoformat(),
        "job_id": job.id,
        "status": JobStatus.SUCCEEDED,
        "public_dataset": True,
        "dataset": {
            "id": dataset.id,
            "name": dataset.name,
            "sha256": dataset.sha256,
            "public": True,
            "n_rows": dataset.n_rows,
            "feature_shape": dataset.feature_shape,
            "task": dataset.task,
            "n_classes": dataset.n_classes,
            **_class_list_fields(dataset),
        },
        "preparation": preparation_report(dataset.preparation),
        "guarantee": PUBLIC_DATASET_GUARANTEE,
        "model": {"name": job.model_name, "params": spec.model.params, "sha256": model_sha256},
        "algorithm": {
            "name": job.algorithm,
            "private": get_algorithm(job.algorithm).private,
            "hyperparameters": spec.algorithm.hyperparameters,
            "training": spec.training.to_json(),
        },
        "training_run": {
            "sampling": sampling,
            "sampling_probability": job.sampling_probability,
            "expected_batch_size": expected_batch_size,
            "steps_planned": job.steps_planned,
            "steps_run": job.steps_run,
        },
        "released_metrics": metrics,
        **_generation_fields(dataset, private=False),
        "caveats": [
            "The owner declared this dataset public when uploading it: the service keeps no budget or "
            "ledger for it, and nothing in this report bounds what the released model reveals about its rows."
        ],
    }


def _generation_fields(dataset: Dataset, *, private: bool) -> dict[str, Any]:
    """A language model's report says what text sampled from it (``POST /v1/jobs/{id}/generate``)
    costs: nothing, as post-processing of the released model. Other tasks get no section."""
    if dataset.task != "language-model":
        return {}
    bound = (
        "the job's guarantee covers it as it covers the model"
        if private
        else "the dataset is public, so nothing bounds how much of its text the samples reproduce"
    )
    return {
        "generation": {
            "post_processing": True,
            "statement": "text generated from the released model is post-processing of it: generating reads "
            f"no training row and costs no privacy budget; {bound}",
        }
    }


def public_report_html(report: dict[str, Any]) -> str:
    """The HTML form of :func:`build_public_report`: the statement first, then the report as JSON."""
    body = html.escape(json.dumps(report, indent=2, allow_nan=False))
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Report of job {html.escape(str(report['job_id']))}</title></head><body>"
        f"<h1>Job {html.escape(str(report['job_id']))}</h1>"
        f"<p><strong>{html.escape(str(report['guarantee']).capitalize())}.</strong></p>"
        f"<pre>{body}</pre></body></html>"
    )


def released_weights_section(ema_decay: float | None) -> dict[str, Any]:
    """Which weights the model file holds: the last iterate, or (``training.ema_decay``) their
    exponential moving average, a function of the iterates only, hence free post-processing."""
    if ema_decay is None:
        return {"method": "last-iterate", "statement": "released weights: the last iterate"}
    return {
        "method": "ema",
        "decay": ema_decay,
        "statement": f"released weights: exponential moving average of the iterates (decay {ema_decay}), "
        "post-processing: no privacy cost",
    }


def augmentation_section(augmult: int | None, *, private: bool = True) -> dict[str, Any]:
    """How each sampled image was seen: as itself, or (``training.augmult`` = K) as K random crops
    and flips whose gradients were averaged before clipping. Each row still adds one bounded vector
    to each step's sum, so the sensitivity, the noise and the charge do not depend on K.
    ``private``: False for a non-private optimizer on a public dataset (no clipping, no charge)."""
    if augmult is None or augmult == 1:
        return {"augmult": 1, "statement": "each sampled row was used as it is (no augmentation multiplicity)"}
    seen = f"augmentation multiplicity {augmult}: each sampled image was seen as {augmult} random crops and flips"
    statement = (
        f"{seen}, and its gradient is the mean over them before clipping; a row still contributes one clipped "
        "vector per step, so the charge is the same as with one view"
        if private
        else f"{seen}, and the loss is the mean over them (non-private training on public data: nothing is charged)"
    )
    return {
        "augmult": augmult,
        "views": "random crop of the zero-padded image and random horizontal flip",
        "privacy_charge_depends_on_augmult": False,
        "statement": statement,
    }


def execution_section(
    *,
    device: str,
    steps: int,
    seconds: float,
    expected_batch_size: float,
    precision: str = "fp32",
    augmult: int | None = None,
) -> dict[str, Any]:
    """Where and how fast the job trained: the device, the steps this worker ran and the throughput.

    Throughput counts the PUBLIC expected batch size per step (q·n), never the realised Poisson
    batch sizes, whose sum would say something about the rows; ``seconds`` is the training loop's
    wall time on the attempt that finished (a resumed job counts the steps of that attempt only).
    """
    per_second = steps * expected_batch_size / seconds if seconds > 0 and steps > 0 else None
    views = f", {augmult} augmented views per example" if augmult is not None and augmult > 1 else ""
    rate = f"{per_second:,.0f} examples/s" if per_second is not None else "no steps timed"
    return {
        "device": device,
        "steps": steps,
        "seconds": round(seconds, 6),
        "examples_per_second": per_second,
        "examples_per_second_basis": "expected batch size × steps / seconds of the training loop",
        "precision": precision,
        "augmult": augmult,
        "statement": f"trained on {device} in {precision}{views}: {steps} steps in {seconds:,.1f} s, {rate} "
        "(counted with the public expected batch size)",
    }
