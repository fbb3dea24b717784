"""What a worker asks of the kernel to run one job, in one place: read and re-derive it, claim it,
read its data, keep its private state, record its progress, settle it.

Why one facade: the worker holds the torch work only; each thing it needs from the service's
records is one call here, so its crossings into the kernel are few and named (bench/job_walk.py
counts them). Torch-free, like all of kernel/: the worker builds tensors from what these return.
Private values (rows, labels, units, hold-out coins, checkpoints) pass through here in memory and
worker storage only: never into a log line, an event or a report.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from algorithms import PrivacyPlan
from kernel import privacy
from kernel.config import Settings
from kernel.datasets.deletion import DatasetEraser
from kernel.datasets.facts import DatasetFacts, public_class_list
from kernel.datasets.stored_facts import facts_of
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job
from kernel.ingest import IngestLimits, parse_dataset, parse_image_labels, preparation_from_json
from kernel.ingest.dataset import ParsedDataset
from kernel.ingest.jsonl import JsonlFields
from kernel.ingest.text import ScannedText, rescan_text
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.evaluation import EvaluationPlan
from kernel.jobs.planning import RebuiltJob, compose_job_event, rebuild_job
from kernel.jobs.private_files import CHECKPOINT_SUFFIX, HOLDOUT_SUFFIX, PRIVATE_SUFFIXES, JobPrivateFiles
from kernel.model_catalogue import ModelSizeLimits, get_model
from kernel.privacy import TrialDistribution
from kernel.reporting.ended_report import EndedReportWriter, ended_report_inputs, reservation_report_writer
from kernel.reporting.privacy_report import execution_section
from kernel.reporting.released_report import ReleasedTraining, prepare_release, released_model_report
from kernel.schemas.stored_spec import StoredJobSpec, stored_spec
from kernel.storage.blobs import BlobStore
from kernel.storage.configured import blob_store_from_settings
from kernel.tuning import trial_queue
from kernel.tuning.planning import RebuiltCandidate, rebuild_candidates
from kernel.tuning.trial_files import TrialFiles

__all__ = [
    "TUNING_FROM_AN_OLDER_RELEASE",
    "DataSource",
    "Execution",
    "JobRun",
    "PrivateState",
    "Rederived",
    "TuningPool",
    "chunk_rows",
    "job_event_json",
    "replan",
]

log = logging.getLogger("privtrain.worker")

TUNING_FROM_AN_OLDER_RELEASE = "tuning-from-an-older-release"
"""A tuning admitted before slots existed: refused before any data is read (nothing is spent)."""


def job_event_json(
    plan: PrivacyPlan, evaluation: EvaluationPlan | None, *, noise_multiplier: float, steps: int, evaluated: bool
) -> dict[str, Any]:
    """The privacy event of ``steps`` steps of ``plan`` (and its evaluation when ``evaluated``), as stored."""
    event = compose_job_event(plan, evaluation, noise_multiplier=noise_multiplier, steps=steps, evaluated=evaluated)
    return privacy.event_to_json(event)


def replan(job: Job, dataset: Dataset) -> RebuiltJob:
    """Rebuild the plan from the stored spec; the worker refuses a job whose charge differs."""
    rebuilt = rebuild_job(stored_spec(job), job.algorithm, dataset)
    plan = rebuilt.plan
    charged = job_event_json(
        plan, rebuilt.evaluation, noise_multiplier=job.noise_multiplier, steps=plan.steps, evaluated=True
    )
    if charged != job.event or plan.steps != job.steps_planned:
        raise RuntimeError("the job's stored event differs from its re-derived plan")
    return rebuilt


def chunk_rows(
    settings: Settings, *, model_name: str, params: dict[str, Any], facts: DatasetFacts, device_memory_bytes: int | None
) -> int:
    """Rows per per-sample-gradient chunk a worker with ``settings`` uses (bounds memory, never
    results): on a GPU of ``device_memory_bytes``, larger chunks in a share of its memory
    (ModelSizeLimits.for_gpu); None on a CPU. ``params`` must be valid for the model."""
    limits = (
        ModelSizeLimits.for_gpu(settings, device_memory_bytes=device_memory_bytes)
        if device_memory_bytes is not None
        else ModelSizeLimits.from_settings(settings)
    )
    return get_model(model_name).rows_per_chunk(params, facts, limits=limits)


@dataclass(frozen=True)
class TuningPool:
    """A tuning's candidates, re-derived and checked against its charge."""

    distribution: TrialDistribution
    candidates: tuple[RebuiltCandidate, ...]
    metric: str
    schedule: dict[str, Any]
    """Its public slots (kernel/schemas/stored_spec.py: StoredSchedule), as stored."""


@dataclass(frozen=True)
class Rederived:
    """A job and its dataset with what a claim computes before its transaction; ``refusal`` (an
    error code) fails the job, and then ``rebuilt`` may be None."""

    job: Job
    dataset: Dataset
    refusal: str | None
    rebuilt: RebuiltJob | None = None
    tuning: TuningPool | None = None
    facts: DatasetFacts | None = None
    n_outputs: int | None = None
    """The model's outputs on this dataset (the same for every candidate of a tuning)."""
    spec: StoredJobSpec | None = None
    """The job's stored spec, typed (kernel/schemas/stored_spec.py)."""


@dataclass(frozen=True)
class DataSource:
    """A dataset's stored inputs, read as at upload: the worker turns them into rows for its device.

    ``class_names``: the public class list the labels are mapped to (by name, exactly as at upload).
    Tabular: ``table``, the rows with the owner's declared preparation applied (a public map of
    each row, no privacy cost). Image: ``array`` (the decoded uint8 array) and ``labels``. Text:
    ``array`` (the token ids) and ``scanned`` (labels and units re-read from the upload; None when
    neither is needed: a language model without privacy units)."""

    class_names: tuple[str, ...] | None
    array: Path | None = None
    table: ParsedDataset | None = None
    labels: np.ndarray | None = None
    scanned: ScannedText | None = None


@dataclass(frozen=True)
class Execution:
    """Where and how long the attempt that finished trained (the report's execution section)."""

    device: str
    """As the report names it (e.g. "NVIDIA H100 80GB HBM3", "cpu")."""
    steps: int
    """The steps this attempt ran (a resumed job's own steps only)."""
    seconds: float
    """The training loop's wall time."""


@dataclass(frozen=True)
class PrivateState:
    """Where a job's private files lie on this host (worker storage only)."""

    checkpoint: Path
    holdout: Path


@dataclass(frozen=True)
class JobRun:
    """The kernel's side of the jobs one worker runs: its services and, per job, one call each."""

    settings: Settings
    db: Database
    blobs: BlobStore
    private_files: JobPrivateFiles
    trial_files: TrialFiles
    eraser: DatasetEraser
    actor: str

    @classmethod
    def build(cls, settings: Settings, *, db: Database | None, actor: str) -> JobRun:
        database = db or Database(settings.resolved_database_url)
        blobs = blob_store_from_settings(settings)
        return cls(
            settings=settings,
            db=database,
            blobs=blobs,
            private_files=JobPrivateFiles(settings.checkpoint_dir, blobs),
            trial_files=TrialFiles(settings.checkpoint_dir, blobs),
            eraser=DatasetEraser.from_settings(settings, db=database, blobs=blobs),
            actor=actor,
        )

    # ------------------------------------------------------------------ claim

    def read(self, job_id: str) -> tuple[Job, Dataset] | None:
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            dataset = session.get(Dataset, job.dataset_id) if job is not None else None
        if job is None or dataset is None:
            return None
        return job, dataset

    def prepare(self, job_id: str) -> Rederived | None:
        """The job re-derived from its stored spec and checked against its charge (None: no such job).

        Outside the claim's transaction: planning can take seconds for large models, and a job's
        spec and dataset facts never change after submission."""
        read = self.read(job_id)
        if read is None:
            return None
        job, dataset = read
        spec = stored_spec(job)
        if spec.tuning is not None and spec.tuning.schedule is None:
            return Rederived(job=job, dataset=dataset, refusal=TUNING_FROM_AN_OLDER_RELEASE)
        try:
            tuning = self._pool(job, dataset) if spec.tuning is not None else None
            rebuilt = tuning.candidates[0].rebuilt if tuning is not None else replan(job, dataset)
        except Exception:
            log.exception("refusing a job whose charge cannot be re-derived", extra={"job_id": job_id})
            return Rederived(job=job, dataset=dataset, refusal="plan-mismatch")
        return self._shaped(job, dataset, rebuilt=rebuilt, tuning=tuning)

    def tuning(self, job_id: str) -> Rederived:
        """A tuning as its slots run it, re-derived (raises when it is not a tuning or differs)."""
        read = self.read(job_id)
        if read is None or stored_spec(read[0]).tuning is None:
            raise RuntimeError("a tuning slot's job is not a tuning")
        job, dataset = read
        tuning = self._pool(job, dataset)
        return self._shaped(job, dataset, rebuilt=tuning.candidates[0].rebuilt, tuning=tuning)

    @staticmethod
    def _pool(job: Job, dataset: Dataset) -> TuningPool:
        spec = stored_spec(job)
        if spec.tuning is None or spec.tuning.schedule is None:
            raise RuntimeError("the job is not a tuning with slots")
        distribution, candidates = rebuild_candidates(spec, job.algorithm, dataset, job.event)
        return TuningPool(
            distribution, candidates, metric=spec.tuning.selection.metric, schedule=spec.tuning.schedule.to_json()
        )

    @staticmethod
    def _shaped(job: Job, dataset: Dataset, *, rebuilt: RebuiltJob, tuning: TuningPool | None) -> Rederived:
        facts = facts_of(dataset)
        n_outputs = get_model(job.model_name).n_outputs(facts)
        return Rederived(
            job=job,
            dataset=dataset,
            refusal=None,
            rebuilt=rebuilt,
            tuning=tuning,
            facts=facts,
            n_outputs=n_outputs,
            spec=stored_spec(job),
        )

    def claim(self, *, job_id: str, dataset: Dataset, refusal: str | None) -> Job | None:
        """queued → running (attempt + 1) and, on the first attempt, TOUCH (kernel/jobs/lifecycle.py).
        With a ``refusal`` the job fails instead: a retried job an earlier, lost attempt touched
        commits its reservation with its report, delivered here."""
        job = lifecycle.claim(
            self.db,
            job_id=job_id,
            dataset_id=dataset.id,
            actor=self.actor,
            refusal=refusal,
            write_report=None if refusal is None else self._refusal_report(job_id, dataset),
        )
        if refusal is not None:
            report_outbox.deliver(self.db, self.blobs, job_id=job_id)
        return job

    def _refusal_report(self, job_id: str, dataset: Dataset) -> EndedReportWriter | None:
        """A refused claim commits only a job an earlier, lost attempt touched: its report is
        prepared for its whole reservation (the lost worker's noise mode is not known)."""
        read = self.read(job_id)
        job = read[0] if read is not None else None
        touched = job is not None and job.touched_at is not None
        return reservation_report_writer(job, dataset, commits_reservation=touched)

    # ------------------------------------------------------------------ training

    def data(self, dataset: Dataset) -> DataSource:
        """The dataset's stored inputs (see :class:`DataSource`); raises when they differ from its record."""
        limits = IngestLimits.from_settings(self.settings)
        public = public_class_list(
            task=dataset.task,
            n_classes=dataset.n_classes,
            class_names=dataset.class_names,
            declared=dataset.classes_declared,
        )
        names = public.names if public is not None else None
        if dataset.modality == "image":
            assert dataset.array_blob_key is not None
            array = self.blobs.local_path(dataset.array_blob_key)
            labels = parse_image_labels(
                self.blobs.local_path(dataset.blob_key), fmt=dataset.format, task=dataset.task, classes=names,
                limits=limits,
            )  # fmt: skip
            return DataSource(class_names=names, array=array, labels=labels)
        if dataset.modality == "text":
            assert dataset.array_blob_key is not None and dataset.pad_id is not None and dataset.text_field is not None
            array = self.blobs.local_path(dataset.array_blob_key)
            if dataset.task != "classification" and dataset.privacy_unit_column is None:
                return DataSource(class_names=names, array=array)
            fields = JsonlFields(
                text=dataset.text_field,
                label=dataset.label_column or JsonlFields().label,
                unit=dataset.privacy_unit_column,
            )
            scanned = rescan_text(
                self.blobs.local_path(dataset.blob_key), task=dataset.task, classes=names, fields=fields, limits=limits
            )
            return DataSource(class_names=names, array=array, scanned=scanned)
        parsed = parse_dataset(
            self.blobs.local_path(dataset.blob_key),
            fmt=dataset.format,
            label_column=dataset.label_column,
            task=dataset.task,
            limits=limits,
            classes=names,
            preparation=preparation_from_json(dataset.preparation, limits=limits),
            unit_column=dataset.privacy_unit_column,
        )
        if parsed.n_units != dataset.n_units:
            raise ValueError(f"dataset {dataset.id}: its privacy units differ from the registered count")
        return DataSource(class_names=names, table=parsed)

    def private_state(self, job_id: str, *, evaluated: bool) -> PrivateState:
        """An earlier attempt's checkpoint and hold-out split, from the store when this host has
        none (the attempt ran on another host). A checkpoint is used only with the split it was
        trained on: when an evaluated job's split cannot be found, its checkpoint is dropped and
        the job starts over inside its reservation (sound: a checkpoint is never released)."""
        has = {suffix: self.private_files.fetch(job_id, suffix) for suffix in PRIVATE_SUFFIXES}
        checkpoint = self.private_files.path(job_id, CHECKPOINT_SUFFIX)
        if evaluated and not has[HOLDOUT_SUFFIX]:
            checkpoint.unlink(missing_ok=True)
        return PrivateState(checkpoint=checkpoint, holdout=self.private_files.path(job_id, HOLDOUT_SUFFIX))

    def keep(self, job_id: str, suffix: str) -> None:
        """Copy a private file (CHECKPOINT_SUFFIX, HOLDOUT_SUFFIX) to the store's private area."""
        self.private_files.keep(job_id, suffix)

    def progress(self, *, attempt: lifecycle.Attempt, plan: PrivacyPlan, job: Job, public: bool, step: int) -> bool:
        """Record ``step`` and the ε spent so far; True once a cancel was asked for, or a newer
        attempt owns the job (the worker then stops quietly)."""
        spent = (
            0.0  # a public dataset has no budget: nothing is spent
            if public
            else privacy.ledger_epsilon(privacy.rdp_curve(plan.event_for(job.noise_multiplier, step)), job.delta)
        )
        return lifecycle.record_progress(
            self.db, attempt=attempt, step=step, steps_planned=job.steps_planned, epsilon_spent=spent
        )

    def heartbeat(self, attempt: lifecycle.Attempt) -> bool:
        return lifecycle.heartbeat(self.db, attempt=attempt)

    # ------------------------------------------------------------------ settlement

    def release(
        self,
        *,
        attempt: lifecycle.Attempt,
        job: Job,
        dataset: Dataset,
        rebuilt: RebuiltJob,
        model_path: Path,
        steps_run: int,
        metrics: dict[str, Any] | None,
        ran: Execution | None,
        single_job: Callable[[dict[str, Any]], privacy.SingleJobEpsilon | None] | None = None,
    ) -> bool:
        """Store the model, then commit the steps run with the released evaluation and the report
        (lifecycle.succeed), then deliver the report and clean up; False: a stale attempt.
        ``single_job``: the single-job ε of the event run, when the worker computed it while the
        job trained (it answers None when the job did not run as planned)."""
        model_key, model_sha = self.blobs.put_file(model_path)
        actual = job_event_json(
            rebuilt.plan, rebuilt.evaluation, noise_multiplier=job.noise_multiplier, steps=steps_run, evaluated=True
        )
        training = rebuilt.training
        # Numeric accountants may take a while: never under the database write lock.
        release = prepare_release(
            job,
            dataset=dataset,
            trained=ReleasedTraining(plan=rebuilt.plan, hyperparameters=rebuilt.hyperparameters, training=training),
            actual_event=actual,
            metrics=metrics,
            model_sha256=model_sha,
            secure_gaussian=self.settings.secure_noise,
            execution=None
            if ran is None
            else execution_section(
                device=ran.device,
                steps=ran.steps,
                seconds=ran.seconds,
                expected_batch_size=rebuilt.plan.expected_batch_size,
                precision=training.precision or "fp32",
                augmult=training.augmult,
            ),
            single_job=single_job(actual) if single_job is not None else None,
        )
        success = lifecycle.Success(
            steps_run=steps_run,
            actual_event=actual,
            model_blob=model_key,
            model_sha256=model_sha,
            metrics=metrics,
            epsilon_prv=release.single_job.epsilon,
        )
        write_report = functools.partial(released_model_report, release=release)
        done = lifecycle.succeed(self.db, attempt=attempt, success=success, actor=self.actor, write_report=write_report)
        if done:
            self.cleanup(attempt.job_id)
        return done

    def stop_early(
        self,
        *,
        attempt: lifecycle.Attempt,
        job: Job,
        dataset: Dataset,
        rebuilt: RebuiltJob | None,
        steps_run: int,
        actual_event: dict[str, Any],
        single_job: privacy.SingleJobEpsilon | None,
    ) -> bool:
        """Commit the steps that ran and release the rest (lifecycle.stop_early) with the report
        of what ran, then clean up. ``rebuilt``: the plan it ran (None for a tuning, whose
        mechanism is its pool's); ``single_job``: the numeric one of ``actual_event``, if any."""
        writer = self._ended_writer(job, dataset, rebuilt=rebuilt, committed_event=actual_event, single_job=single_job)
        done = lifecycle.stop_early(
            self.db,
            attempt=attempt,
            steps_run=steps_run,
            actual_event=actual_event,
            actor=self.actor,
            write_report=writer,
        )
        if done:
            self.cleanup(attempt.job_id)
        return done

    def fail(
        self, *, attempt: lifecycle.Attempt, job: Job, dataset: Dataset, rebuilt: RebuiltJob | None, error_code: str
    ) -> bool:
        """Commit the whole reservation (lifecycle.fail: the data was opened) with its report, then clean up."""
        writer = self._ended_writer(job, dataset, rebuilt=rebuilt, committed_event=job.event)
        done = lifecycle.fail(self.db, attempt=attempt, error_code=error_code, actor=self.actor, write_report=writer)
        if done:
            self.cleanup(attempt.job_id)
        return done

    def _ended_writer(
        self,
        job: Job,
        dataset: Dataset,
        *,
        rebuilt: RebuiltJob | None,
        committed_event: dict[str, Any],
        single_job: privacy.SingleJobEpsilon | None = None,
    ) -> EndedReportWriter | None:
        """The report writer of a job this worker ends without success; its inputs computed now,
        outside the settling transaction (a failure here leaves them to the writer)."""
        if dataset.public:
            return None
        secure = self.settings.secure_noise
        try:
            inputs = ended_report_inputs(
                job,
                dataset,
                committed_event=committed_event,
                single_job=single_job,
                secure_gaussian=secure,
                rebuilt=rebuilt,
            )
        except Exception:
            log.exception("could not prepare an ended job's report", extra={"job_id": job.id})
            inputs = None
        return EndedReportWriter(inputs, secure_gaussian=secure)

    def cleanup(self, job_id: str) -> None:
        """After a settlement's commit: its report's upload, then the job's secret files."""
        report_outbox.deliver(self.db, self.blobs, job_id=job_id)
        self.trial_files.discard(trial_queue.clear(self.db, job_id=job_id))  # a tuning's trials (secret)
        self.private_files.discard(job_id)
        try:  # a deletion of its dataset that waited for this job (kernel/datasets/deletion.py)
            self.eraser.after_job(job_id)
        except Exception:  # the reconciler's next round finishes it
            log.warning("finishing a dataset deletion failed", extra={"job_id": job_id}, exc_info=True)
