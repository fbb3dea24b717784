"""A job's life on a worker: claim → touch → train → evaluate → write artifacts → commit.

Every state change is a transition of kernel.jobs.lifecycle (one database transaction that first
locks the dataset's budget row, so the job row and the ledger always move together; the module
states the privacy rules). Only the torch work is here. A retried attempt (after a lost worker) runs inside
the same reservation: it is claimed again but never reserves or touches again, and resumes from
its checkpoint with the same SecureRandom state and hold-out split (both secret: worker storage
only, never in a log line, event, report or model artifact). Messages of an old attempt are
no-ops. Errors shown to users are generic codes; tracebacks go to operator logs only
(docs/privacy-model.md §1).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from algorithms import PrivacyPlan, get_algorithm
from algorithms.trainers import TrainingRequest, get_trainer, preflight
from dp.data.images import ImageRows
from dp.data.rows import Rows, TensorRows, place_image_rows
from dp.data.tokens import TokenRows, language_model_targets
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.config import Settings
from kernel.datasets.deletion import DatasetEraser
from kernel.datasets.facts import DatasetFacts, public_class_list
from kernel.datasets.stored_facts import facts_of
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job
from kernel.ingest import IngestLimits, parse_dataset, parse_image_labels, preparation_from_json
from kernel.ingest.jsonl import JsonlFields
from kernel.ingest.text import rescan_text
from kernel.jobs import lifecycle, report_outbox
from kernel.jobs.dispatch import Dispatcher, dispatch_with_settings
from kernel.jobs.evaluation import EvaluationPlan
from kernel.jobs.planning import RebuiltJob, compose_job_event, rebuild_job
from kernel.jobs.private_files import CHECKPOINT_SUFFIX, HOLDOUT_SUFFIX, PRIVATE_SUFFIXES, JobPrivateFiles
from kernel.jobs.status import JobStatus
from kernel.model_catalogue import ModelSizeLimits, get_model
from kernel.reporting.ended_report import EndedReportWriter, ended_report_inputs
from kernel.reporting.privacy_report import (
    execution_section,
)
from kernel.reporting.released_report import ReleasedTraining, prepare_release, released_model_report
from kernel.schemas.jobs import TrainingSpec
from kernel.storage.blobs import StorageUnavailable
from kernel.storage.configured import blob_store_from_settings
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.closing import Closer
from kernel.tuning.planning import is_tuning, rebuild_candidates
from kernel.tuning.selection import TrialResult, best_of, score_of
from kernel.tuning.trial_files import TrialFiles
from privtrain_common.model_files import save_model
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_checkpoint_extras, load_training_state, save_training_state
from training.ema import ParameterAverage
from training.finetune import apply_finetune
from training.init_weights import apply_init, init_blob_path
from training.lora import merge_lora
from worker import evaluation as dp_evaluation
from worker.holdout_split import coin_count, split_rows
from worker.single_job_prefetch import SingleJobPrefetch
from worker.tuning import TuningClaim, trial_count
from worker.tuning_slot import Pacer, SlotClock, SlotTrial, wait_out

log = logging.getLogger("privtrain.worker")


def _init_generator() -> torch.Generator:
    """Model initialisation's own generator (non-private: init is data-independent).

    Deliberately a plain torch.Generator, separate from the job's SecureRandom, so building the
    model never consumes or shares the noise stream; OS-seeded only so jobs do not all start alike.
    """
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))


PROGRESS_MIN_GAP_S = 0.5
"""Progress is written every 1% of the steps, the heartbeat interval and the last step, but never
twice within this gap (except the last step): each write is a database transaction and an ε
computation, which a short job on a GPU, at milliseconds a step, would otherwise pay every step."""

PREFETCH_SINGLE_JOB_ON: set[str] = {"cuda"}
"""Device types whose workers compute the report's single-job ε while the job trains."""


def _training_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _device_memory_bytes(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).total_memory)


def rows_per_chunk(
    settings: Settings, *, model_name: str, params: dict[str, Any], facts: DatasetFacts, device: torch.device
) -> int:
    """Rows per per-sample-gradient chunk a worker with ``settings`` uses for the model on ``device``
    (bounds memory, never results): on a GPU, larger chunks in a share of its memory
    (ModelSizeLimits.for_gpu). ``params`` must be valid for the model."""
    limits = (
        ModelSizeLimits.for_gpu(settings, device_memory_bytes=_device_memory_bytes(device))
        if device.type == "cuda"
        else ModelSizeLimits.from_settings(settings)
    )
    return get_model(model_name).rows_per_chunk(params, facts, limits=limits)


@dataclass(frozen=True)
class Claimed:
    job: Job
    dataset: Dataset
    plan: PrivacyPlan
    evaluation: EvaluationPlan | None
    hyperparameters: BaseModel
    """Re-validated from the stored spec by the catalogue (what the trainer reads)."""
    training: TrainingSpec
    tuning: TuningClaim | None = None
    """A tuning's candidates (the job runs its trials); None for an ordinary job."""

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def held(self) -> lifecycle.Attempt:
        """This attempt's hold on the job, as the lifecycle transitions check it."""
        return lifecycle.Attempt(job_id=self.job.id, dataset_id=self.dataset.id, number=self.job.attempt)

    def event_json(self, steps: int, *, evaluated: bool) -> dict[str, Any]:
        if self.tuning is not None:  # a tuning commits its whole event, however it ends
            return dict(self.job.event)
        event = compose_job_event(
            self.plan,
            self.evaluation,
            noise_multiplier=self.job.noise_multiplier,
            steps=steps,
            evaluated=evaluated,
        )
        return privacy.event_to_json(event)


@dataclass(frozen=True)
class Outcome:
    result: TrainingResult
    model_path: Path | None
    metrics: dict[str, object] | None
    timed_out: bool = False
    execution: dict[str, Any] | None = None
    """Device, steps and throughput of the attempt that finished (the report's execution section)."""


OPENED = "opened"
"""What running a tuning's job answers: its trials were drawn and its slots created."""

SLOT_DONE = "done"
"""What a tuning slot's task answers when it was not the last one, whatever it held."""

TUNING_FROM_AN_OLDER_RELEASE = "tuning-from-an-older-release"
"""A tuning admitted before slots existed: refused before any data is read (nothing is spent)."""


@dataclass
class _SlotTuning:
    """A tuning as this worker's slots run it: re-derived once, its data loaded at its first trial."""

    claimed: Claimed
    schedule: dict[str, Any]
    data: tuple[Rows, torch.Tensor, np.ndarray | None] | None = None


def device_label(device: torch.device) -> str:
    """The device a job ran on, as its report names it (e.g. "NVIDIA H100 80GB HBM3", "cpu")."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def _actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


def replan(job: Job, dataset: Dataset) -> RebuiltJob:
    """Rebuild the plan from the stored spec; the worker refuses a job whose charge differs."""
    rebuilt = rebuild_job(job.spec, job.algorithm, dataset)
    plan, evaluation = rebuilt.plan, rebuilt.evaluation
    charged = privacy.event_to_json(
        compose_job_event(plan, evaluation, noise_multiplier=job.noise_multiplier, steps=plan.steps, evaluated=True)
    )
    if charged != job.event or plan.steps != job.steps_planned:
        raise RuntimeError("the job's stored event differs from its re-derived plan")
    return rebuilt


def _with_spec(job: Job, spec: dict[str, Any]) -> Job:
    """A detached copy of ``job`` with another spec (a tuning's candidate), to build its model."""
    return Job(id=job.id, model_name=job.model_name, dataset_id=job.dataset_id, spec=spec)


def algorithm_notes(job: Job, plan: PrivacyPlan, hyperparameters: BaseModel) -> dict[str, Any]:
    return get_algorithm(job.algorithm).report_notes(
        hyperparameters, plan, noise_multiplier=job.noise_multiplier, delta=job.delta
    )


@dataclass(frozen=True)
class _Prepared:
    """What a claim needs that is computed before its transaction; ``refusal`` fails the job."""

    dataset: Dataset
    plan: PrivacyPlan | None
    evaluation: EvaluationPlan | None
    refusal: str | None
    rebuilt: RebuiltJob | None = None
    tuning: TuningClaim | None = None

    def claimed(self, job: Job) -> Claimed:
        """The job as its attempt runs it (only for a job that was not refused)."""
        assert self.plan is not None and self.rebuilt is not None  # else refused: no job
        return Claimed(
            job=job,
            dataset=self.dataset,
            plan=self.plan,
            evaluation=self.evaluation,
            hyperparameters=self.rebuilt.hyperparameters,
            training=self.rebuilt.training,
            tuning=self.tuning,
        )


class JobRunner:
    def __init__(
        self,
        settings: Settings,
        *,
        db: Database | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        """``dispatcher``: sends the next queued job or tuning slot once this worker has taken one
        (fair sharing, kernel/jobs/dispatch.py); None in tests that run jobs in process."""
        self.settings = settings
        self.db = db or Database(settings.resolved_database_url)
        self.blobs = blob_store_from_settings(settings)
        self.trial_files = TrialFiles(settings.checkpoint_dir, self.blobs)
        self.private_files = JobPrivateFiles(settings.checkpoint_dir, self.blobs)
        self.eraser = DatasetEraser.from_settings(settings, db=self.db, blobs=self.blobs)
        self.actor = _actor()
        self.dispatcher = dispatcher
        self._tuning: _SlotTuning | None = None
        """The tuning whose slots this worker ran last (its data stay loaded for the next slot)."""

    def _send_next(self) -> None:
        """This worker's broker slot is free: let the next job in, chosen fairly."""
        if self.dispatcher is None:
            return
        try:
            dispatch_with_settings(self.db, self.dispatcher, self.settings)
        except Exception:  # the API and the reconciler send it otherwise
            log.exception("could not send the next job")

    # ------------------------------------------------------------------ claim

    def _prepare(self, job_id: str) -> _Prepared | None:
        """Re-derive the job's charge and check it against its model, before any lock is taken.

        Why outside the claim's transaction: building a model (and planning) can take seconds for
        large models, and on SQLite the write transaction blocks every other writer meanwhile
        (another tenant's upload, a submission). A job's spec and dataset facts never change
        after submission, so what is computed here still holds when the claim commits.
        """
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            dataset = session.get(Dataset, job.dataset_id) if job is not None else None
        if job is None or dataset is None:
            return None
        tuning = None
        if is_tuning(job.spec) and "schedule" not in job.spec["tuning"]:
            return _Prepared(dataset=dataset, plan=None, evaluation=None, refusal=TUNING_FROM_AN_OLDER_RELEASE)
        try:
            if is_tuning(job.spec):
                distribution, candidates = rebuild_candidates(job.spec, job.algorithm, dataset, job.event)
                tuning = TuningClaim(distribution, candidates, metric=job.spec["tuning"]["selection"]["metric"])
                rebuilt = candidates[0].rebuilt
            else:
                rebuilt = replan(job, dataset)
            plan, evaluation = rebuilt.plan, rebuilt.evaluation
        except Exception:
            log.exception("refusing a job whose charge cannot be re-derived", extra={"job_id": job_id})
            return _Prepared(dataset=dataset, plan=None, evaluation=None, refusal="plan-mismatch")
        try:  # checks that need the model but not the data: fail before TOUCH
            for spec, hyperparameters in (
                [(c.spec, c.rebuilt.hyperparameters) for c in tuning.candidates]
                if tuning is not None
                else [(job.spec, rebuilt.hyperparameters)]
            ):
                preflight(job.algorithm, self._starting_model(_with_spec(job, spec), dataset), hyperparameters)
        except ValueError:
            log.exception("job spec does not fit its model", extra={"job_id": job_id})
            return _Prepared(dataset=dataset, plan=plan, evaluation=evaluation, refusal="invalid-for-model")
        return _Prepared(
            dataset=dataset, plan=plan, evaluation=evaluation, refusal=None, rebuilt=rebuilt, tuning=tuning
        )

    def claim(self, job_id: str) -> Claimed | None:
        """queued → running (attempt + 1) and, on the first attempt, TOUCH — one short transaction."""
        prepared = self._prepare(job_id)
        if prepared is None:
            log.warning("unknown job", extra={"job_id": job_id})
            return None
        refusal = prepared.refusal or ("plan-mismatch" if prepared.plan is None or prepared.rebuilt is None else None)
        job = lifecycle.claim(
            self.db,
            job_id=job_id,
            dataset_id=prepared.dataset.id,
            actor=self.actor,
            refusal=refusal,
            write_report=None if refusal is None else self._refusal_report(job_id, prepared.dataset),
        )
        if job is None:
            if refusal is None:
                log.info("job not claimable (duplicate or late message)", extra={"job_id": job_id})
            else:  # a refused retry of a touched job committed ε: its report
                report_outbox.deliver(self.db, self.blobs, job_id=job_id)
            return None
        return prepared.claimed(job)

    def _refusal_report(self, job_id: str, dataset: Dataset) -> EndedReportWriter | None:
        """A refused claim commits only a job an earlier, lost attempt touched: its report is
        prepared for its whole reservation (the lost worker's noise mode is not known)."""
        if dataset.public:
            return None
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
        if job is None or job.touched_at is None:
            return EndedReportWriter()
        try:
            return EndedReportWriter(ended_report_inputs(job, dataset))
        except Exception:
            log.exception("could not prepare an ended job's report", extra={"job_id": job_id})
            return EndedReportWriter()

    # ------------------------------------------------------------------ run

    def run(self, job_id: str) -> str:
        self._tuning = None  # an ordinary job needs the memory more than a tuning's next slot would
        claimed = self.claim(job_id)
        if claimed is None:
            return "skipped"
        self._send_next()
        if claimed.tuning is not None:
            return self._open(claimed)
        # On a GPU worker the report's single-job ε of the planned run is computed on the idle CPU
        # while the job trains (used when the job ran exactly as planned); on a CPU worker it would
        # only take cores from training, so it is computed afterwards.
        single_job = (
            SingleJobPrefetch.start(
                claimed.event_json(claimed.job.steps_planned, evaluated=True),
                delta=claimed.job.delta,
                algorithm=claimed.job.algorithm,
            )
            if _training_device().type in PREFETCH_SINGLE_JOB_ON
            else None
        )
        try:
            outcome = self._train(claimed)
        except StorageUnavailable:
            # Not the job's fault: leave it running without heartbeats, so the reconciler requeues
            # it inside its reservation once it is stale, as for a lost worker (up to max_attempts).
            log.warning("object store unavailable; the job will be retried", extra={"job_id": job_id})
            return "storage-unavailable"
        except Exception:
            log.exception("job failed", extra={"job_id": job_id})
            self.fail(claimed, error_code="training-failed")
            return JobStatus.FAILED
        try:
            if outcome.timed_out:
                self.fail(claimed, error_code="time-limit")
                return JobStatus.FAILED
            if outcome.result.stopped_early:
                return self.settle_stopped(claimed, outcome.result.steps_run)
            assert outcome.model_path is not None
            return self.succeed(claimed, outcome, single_job=single_job)
        except Exception:
            log.exception("finishing the job failed", extra={"job_id": job_id})
            self.fail(claimed, error_code="artifact-write-failed")
            return JobStatus.FAILED
        finally:
            if outcome.model_path is not None:
                outcome.model_path.unlink(missing_ok=True)

    def _load_data(self, dataset: Dataset, device: torch.device) -> tuple[Rows, torch.Tensor]:
        """The rows and labels of :meth:`_load_data_and_units`."""
        rows, y, _units = self._load_data_and_units(dataset, device)
        return rows, y

    def _load_data_and_units(
        self, dataset: Dataset, device: torch.device
    ) -> tuple[Rows, torch.Tensor, np.ndarray | None]:
        """Each row's privacy unit (int64 codes; None when the unit is a row) besides the rows as
        the model sees them, placed for ``device`` (dp/data/rows.py): labels
        mapped to the dataset's public class list (by name, exactly as at upload) and the owner's
        declared preparation applied (columns dropped, one-hot encoded, scaled and clipped to
        declared bounds: a public map of each row, no privacy cost)."""
        limits = IngestLimits.from_settings(self.settings)
        public = public_class_list(
            task=dataset.task,
            n_classes=dataset.n_classes,
            class_names=dataset.class_names,
            declared=dataset.classes_declared,
        )
        names = public.names if public is not None else None
        if dataset.modality == "image":
            return (*self._load_images(dataset, device, limits=limits, classes=names), None)
        if dataset.modality == "text":
            return self._load_tokens(dataset, device, limits=limits, classes=names)
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
        return TensorRows(torch.from_numpy(parsed.X), device=device), torch.from_numpy(parsed.y), parsed.units

    def _load_images(
        self, dataset: Dataset, device: torch.device, *, limits: IngestLimits, classes: tuple[str, ...] | None
    ) -> tuple[Rows, torch.Tensor]:
        """An image dataset: its decoded uint8 array, on the GPU when it fits there, else
        memory-mapped, normalised to x / 255 in (C, H, W) batch by batch (never copied whole as
        float: datasets larger than memory train); its labels from the upload, mapped as at upload."""
        assert dataset.array_blob_key is not None
        channels, height, width = dataset.feature_shape
        rows = ImageRows(self.blobs.local_path(dataset.array_blob_key), shape=(channels, height, width))
        y = parse_image_labels(
            self.blobs.local_path(dataset.blob_key),
            fmt=dataset.format,
            task=dataset.task,
            classes=classes,
            limits=limits,
        )
        if y.shape[0] != rows.n_rows:
            raise ValueError(f"dataset {dataset.id}: {rows.n_rows} images but {y.shape[0]} labels")
        placed = place_image_rows(rows, device, max_device_fraction=self.settings.data_on_device_max_fraction)
        return placed, torch.from_numpy(y)

    def _load_tokens(
        self, dataset: Dataset, device: torch.device, *, limits: IngestLimits, classes: tuple[str, ...] | None
    ) -> tuple[Rows, torch.Tensor, np.ndarray | None]:
        """A text dataset: its stored token ids (int64 batches; on the GPU when they fit, else
        memory-mapped). y: for classification the labels re-read from the upload and mapped as at
        upload; for language modelling the ids themselves with every pad position -100. Units: each
        record's privacy unit, re-read in the same pass (None without a privacy unit column)."""
        assert dataset.array_blob_key is not None and dataset.pad_id is not None and dataset.text_field is not None
        rows = TokenRows.placed(
            self.blobs.local_path(dataset.array_blob_key),
            max_length=int(dataset.feature_shape[0]),
            device=device,
            max_device_fraction=self.settings.data_on_device_max_fraction,
        )
        classification = dataset.task == "classification"
        if not classification and dataset.privacy_unit_column is None:
            return rows, language_model_targets(rows, pad_id=dataset.pad_id), None
        fields = JsonlFields(
            text=dataset.text_field, label=dataset.label_column or JsonlFields().label, unit=dataset.privacy_unit_column
        )
        scanned = rescan_text(
            self.blobs.local_path(dataset.blob_key), task=dataset.task, classes=classes, fields=fields, limits=limits
        )
        mismatch = scanned.n_rows != rows.n_rows or scanned.n_units != dataset.n_units
        if mismatch or (classification and scanned.y is None):
            raise ValueError(f"dataset {dataset.id}: {rows.n_rows} token rows but the upload's records do not match")
        if scanned.y is None:  # a language model per unit: its targets are its own ids
            return rows, language_model_targets(rows, pad_id=dataset.pad_id), scanned.units
        return rows, torch.from_numpy(scanned.y), scanned.units

    def _cleanup(self, job_id: str) -> None:
        report_outbox.deliver(self.db, self.blobs, job_id=job_id)  # after the settlement's commit
        self.trial_files.discard(trial_queue.clear(self.db, job_id=job_id))  # a tuning's trials (secret)
        self.private_files.discard(job_id)
        try:  # a deletion of its dataset that waited for this job (kernel/datasets/deletion.py)
            self.eraser.after_job(job_id)
        except Exception:  # the reconciler's next round finishes it
            log.warning("finishing a dataset deletion failed", extra={"job_id": job_id}, exc_info=True)

    def _restore_private(self, job_id: str, *, evaluated: bool) -> None:
        """An earlier attempt's checkpoint and hold-out split, from the store when this host has
        none (the attempt ran on another host). A checkpoint is used only with the split it was
        trained on: when an evaluated job's split cannot be found, its checkpoint is dropped and
        the job starts over inside its reservation (sound: a checkpoint is never released)."""
        has = {suffix: self.private_files.fetch(job_id, suffix) for suffix in PRIVATE_SUFFIXES}
        if evaluated and not has[HOLDOUT_SUFFIX]:
            self.private_files.path(job_id, CHECKPOINT_SUFFIX).unlink(missing_ok=True)

    def _train(self, claimed: Claimed) -> Outcome:
        job, dataset = claimed.job, claimed.dataset
        device = _training_device()
        X, y, unit_codes = self._load_data_and_units(dataset, device)
        if unit_codes is not None and not get_algorithm(job.algorithm).privacy_units:
            raise ValueError(f"algorithm {job.algorithm} does not train per privacy unit")  # submission refuses it
        self._restore_private(job.id, evaluated=claimed.evaluation is not None)
        coins = None
        if claimed.evaluation is not None:
            coins = dp_evaluation.load_or_draw_holdout(
                self.private_files.path(job.id, HOLDOUT_SUFFIX),
                coin_count(X.n_rows, unit_codes),
                claimed.evaluation.holdout_fraction,
            )
            self.private_files.keep(job.id, HOLDOUT_SUFFIX)
        split = split_rows(X, y, unit_codes, coins, device=device)
        X, y, units = split.X, split.y, split.units
        model = self._starting_model(job, dataset)
        n_outputs = get_model(job.model_name).n_outputs(facts_of(dataset))
        checkpoint = self.private_files.path(job.id, CHECKPOINT_SUFFIX)
        resume = self._resumable(job.id, checkpoint, device)
        average = self._parameter_average(claimed.training, model, checkpoint, resume)
        hooks, timed_out = self._hooks(claimed, checkpoint, model=model, average=average)
        started = time.perf_counter()
        result = get_trainer(job.algorithm)(
            TrainingRequest(
                model=model,
                features=X,
                y=y,
                task=dataset.task,
                hyperparameters=claimed.hyperparameters,
                training=claimed.training,
                noise_multiplier=job.noise_multiplier,
                sampling_probability=job.sampling_probability,
                expected_batch_size=claimed.plan.expected_batch_size,
                steps=job.steps_planned,
                max_physical_batch_size=self._rows_per_chunk(job, dataset, device),
                generator=SecureRandom.from_os_entropy(device, secure_gaussian=self.settings.secure_noise),
                hooks=hooks,
                resume_from=resume,
                device=device,
                units=units,
            )
        )
        if result.stopped_early:
            return Outcome(result=result, model_path=None, metrics=None, timed_out=timed_out())
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the timing covers the queued kernels too
        execution = execution_section(
            device=device_label(device),
            steps=result.steps_run - (resume.step if resume is not None else 0),
            seconds=time.perf_counter() - started,
            expected_batch_size=claimed.plan.expected_batch_size,
            precision=claimed.training.precision or "fp32",
            augmult=claimed.training.augmult,
        )
        if average is not None:  # released and evaluated: the average, not the last iterate
            average.copy_to(model)
        metrics = None
        if claimed.evaluation is not None:
            assert split.X_eval is not None and split.y_eval is not None
            metrics = dp_evaluation.release(
                model,
                split.X_eval,
                split.y_eval,
                claimed.evaluation,
                secure_gaussian=self.settings.secure_noise,
                row_weights=split.eval_weights,
            )
        return Outcome(
            result=result,
            model_path=self._write_model(claimed, model, n_outputs),
            metrics=metrics,
            execution=execution,
        )

    # ------------------------------------------------------------------ tunings

    def _open(self, claimed: Claimed) -> str:
        """Draw the tuning's K (from the OS's CSPRNG, conditioned on its public maximum) and each
        trial's candidate, and create its slots, in one transaction; fair dispatch then sends the
        slots like jobs. Takes the same few milliseconds whatever K is; a retry after a lost worker
        draws afresh (nothing ran)."""
        tuning, job = claimed.tuning, claimed.job
        assert tuning is not None
        schedule = job.spec["tuning"]["schedule"]
        rng = secrets.SystemRandom()
        count = trial_count(tuning.distribution, rng)
        opened = tuning_slots.open_tuning(
            self.db,
            job_id=job.id,
            attempt=claimed.attempt,
            candidates=[tuning.draw_candidate(rng) for _ in range(count)],
            slots=int(schedule["slots"]),
        )
        if not opened:
            return self._stale(claimed)
        self._send_next()
        return OPENED

    def run_slot(self, job_id: str, *, attempt: int, slot: int) -> str:
        """One slot of a tuning (worker/tuning_slot.py): its trial if one is pending, then the wait
        to the slot's end. The worker that finishes the last slot closes the tuning."""
        held = tuning_slots.claim(self.db, job_id=job_id, attempt=attempt, slot=slot, worker=self.actor)
        if held is None:
            return "skipped"
        self._send_next()
        stop = Pacer(self.settings.heartbeat_interval_s, check=lambda: tuning_slots.heartbeat(self.db, slot=held))
        outcome = tuning_slots.OK
        try:
            tuning = self._slot_tuning(job_id, attempt)
        except Exception:
            log.exception("a tuning slot could not re-derive its tuning", extra={"job_id": job_id})
            tuning, outcome = None, "plan-mismatch"
        clock = SlotClock.start(tuning.schedule if tuning is not None else {"trial_time_limit_s": 0, "slot_seconds": 0})
        if tuning is not None:
            try:
                if self._slot_trial(tuning, clock=clock, stop=stop) is SlotTrial.STOPPED:
                    return "stopped"
            except StorageUnavailable:
                log.warning("object store unavailable during a tuning slot", extra={"job_id": job_id})
                outcome = "artifact-write-failed"
            except Exception:
                log.exception("a tuning slot failed", extra={"job_id": job_id})
                outcome = "training-failed"
            if outcome == tuning_slots.OK and clock.overran():
                log.warning("a tuning slot ran past its length; the tuning will fail", extra={"job_id": job_id})
                outcome = "slot-overran"
            if not wait_out(clock, stop):
                return "stopped"
        if not tuning_slots.finish(self.db, slot=held, outcome=outcome):
            return SLOT_DONE
        self._tuning = None  # the tuning is closing: its data are not needed here any more
        return self.closer().close(job_id=job_id, attempt=attempt)

    def closer(self) -> Closer:
        return Closer(
            db=self.db,
            blobs=self.blobs,
            files=self.trial_files,
            secure_gaussian=self.settings.secure_noise,
            actor=self.actor,
        )

    def _slot_tuning(self, job_id: str, attempt: int) -> _SlotTuning:
        """The tuning as its slots run it, kept from this worker's previous slot of the same attempt."""
        cached = self._tuning
        if cached is not None and cached.claimed.job.id == job_id and cached.claimed.attempt == attempt:
            return cached
        self._tuning = None
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            dataset = session.get(Dataset, job.dataset_id) if job is not None else None
        if job is None or dataset is None or not is_tuning(job.spec):
            raise RuntimeError("a tuning slot's job is not a tuning")
        distribution, candidates = rebuild_candidates(job.spec, job.algorithm, dataset, job.event)
        first = candidates[0].rebuilt
        claimed = Claimed(
            job=job,
            dataset=dataset,
            plan=first.plan,
            evaluation=first.evaluation,
            hyperparameters=first.hyperparameters,
            training=first.training,
            tuning=TuningClaim(distribution, candidates, metric=job.spec["tuning"]["selection"]["metric"]),
        )
        self._tuning = _SlotTuning(claimed=claimed, schedule=job.spec["tuning"]["schedule"])
        return self._tuning

    def _slot_trial(self, tuning: _SlotTuning, *, clock: SlotClock, stop: Pacer) -> SlotTrial:
        """Take the next pending trial and run it: stopped at the trial time limit (it then
        releases nothing), its model kept as a private file while it may win."""
        claimed = tuning.claimed
        assert claimed.tuning is not None
        taken = trial_queue.take(self.db, job_id=claimed.job.id, attempt=claimed.attempt, worker=self.actor)
        if taken is None:
            return SlotTrial.NONE
        device = _training_device()
        if tuning.data is None:
            tuning.data = self._load_data_and_units(claimed.dataset, device)
        X, y, unit_codes = tuning.data
        ran = self._run_trial(
            claimed,
            taken.candidate,
            X=X,
            y=y,
            unit_codes=unit_codes,
            device=device,
            stop=lambda: stop() or clock.trial_timed_out(),
        )
        if stop.stopped:
            return SlotTrial.STOPPED
        if ran is None:
            trial_queue.lapse(self.db, trial=taken)
            return SlotTrial.LAPSED
        metrics, model = ran
        result = TrialResult(
            seq=taken.seq, candidate=taken.candidate, metrics=metrics, score=score_of(metrics, claimed.tuning.metric)
        )
        finished = trial_queue.finished(self.db, job_id=claimed.job.id, attempt=claimed.attempt)
        rivals = [TrialResult(seq=t.seq, candidate=t.candidate, metrics=t.metrics, score=t.score) for t in finished]
        name = None
        if best_of([*rivals, result], claimed.tuning.metric) is result:  # else its model is never needed
            name = self.trial_files.name(taken)
            self.trial_files.keep(name, self._write_trial_model(claimed, taken.candidate, model))
        recorded = trial_queue.finish(
            self.db,
            trial=taken,
            score=result.score,
            metrics=metrics,
            model_file=name,
            device=device_label(device),
        )
        if not recorded:
            self.trial_files.discard([name] if name is not None else [])
            return SlotTrial.STOPPED
        return SlotTrial.FINISHED

    def _write_trial_model(self, claimed: Claimed, index: int, model: torch.nn.Module) -> Path:
        """Candidate ``index``'s trained model as the artifact its job would release."""
        assert claimed.tuning is not None
        selected = claimed.tuning.candidates[index]
        chosen = dataclasses.replace(
            claimed, job=_with_spec(claimed.job, selected.spec), training=selected.rebuilt.training
        )
        return self._write_model(chosen, model, get_model(claimed.job.model_name).n_outputs(facts_of(claimed.dataset)))

    def _run_trial(
        self,
        claimed: Claimed,
        index: int,
        *,
        X: Rows,
        y: torch.Tensor,
        unit_codes: np.ndarray | None,
        device: torch.device,
        stop: Callable[[], bool],
    ) -> tuple[dict[str, Any], torch.nn.Module] | None:
        """One trial: candidate ``index`` on its own hold-out split, trained and DP-evaluated;
        its released metrics and model, or None when ``stop()`` stopped it."""
        assert claimed.tuning is not None
        candidate = claimed.tuning.candidates[index]
        evaluation = candidate.rebuilt.evaluation
        assert evaluation is not None  # a tuning's base has an evaluation block
        coins = dp_evaluation.holdout_mask(
            coin_count(X.n_rows, unit_codes),
            evaluation.holdout_fraction,
            dp_evaluation.secure_random(secure_gaussian=self.settings.secure_noise).numpy,
        )
        split = split_rows(X, y, unit_codes, coins, device=device)
        trial_job = _with_spec(claimed.job, candidate.spec)
        model = self._starting_model(trial_job, claimed.dataset)
        average = self._parameter_average(candidate.rebuilt.training, model, Path(os.devnull), None)

        def on_step_end(step: int) -> None:
            if average is not None:
                average.advance_to(step, model)

        result = get_trainer(claimed.job.algorithm)(
            TrainingRequest(
                model=model,
                features=split.X,
                y=split.y,
                task=claimed.dataset.task,
                hyperparameters=candidate.rebuilt.hyperparameters,
                training=candidate.rebuilt.training,
                noise_multiplier=candidate.noise_multiplier,
                sampling_probability=candidate.sampling_probability,
                expected_batch_size=candidate.rebuilt.plan.expected_batch_size,
                steps=candidate.steps,
                max_physical_batch_size=self._rows_per_chunk(trial_job, claimed.dataset, device),
                generator=SecureRandom.from_os_entropy(device, secure_gaussian=self.settings.secure_noise),
                hooks=TrainingHooks(on_step_end=on_step_end, should_stop=stop),
                resume_from=None,
                device=device,
                units=split.units,
            )
        )
        if result.stopped_early:
            return None
        if average is not None:
            average.copy_to(model)
        assert split.X_eval is not None and split.y_eval is not None
        metrics = dp_evaluation.release(
            model,
            split.X_eval,
            split.y_eval,
            evaluation,
            secure_gaussian=self.settings.secure_noise,
            row_weights=split.eval_weights,
        )
        return metrics, model

    @staticmethod
    def _parameter_average(
        training: TrainingSpec, model: torch.nn.Module, checkpoint: Path, resume: TrainingState | None
    ) -> ParameterAverage | None:
        """The average of ``training.ema_decay`` (None when off), continued from the checkpoint on resume."""
        if training.ema_decay is None:
            return None
        average = ParameterAverage(model, decay=training.ema_decay)
        if resume is not None:
            average.restore(load_checkpoint_extras(checkpoint), step=resume.step)
        return average

    @staticmethod
    def _resumable(job_id: str, checkpoint: Path, device: torch.device) -> TrainingState | None:
        """The checkpoint to resume from, or None to start over inside the same reservation.

        A checkpoint whose noise state this worker cannot continue (written before the noise
        source changed, or on another device type) is discarded: restarting is sound, because a
        checkpoint is never released, and only the final model of the attempt that finishes is.
        """
        if not checkpoint.exists():
            return None
        state = load_training_state(checkpoint)
        if not SecureRandom.can_restore(state.generator_state, device):
            log.warning(
                "checkpoint not resumable; restarting the job inside its reservation",
                extra={"job_id": job_id, "device_type": device.type},
            )
            checkpoint.unlink(missing_ok=True)
            return None
        return state

    @staticmethod
    def _build_model(job: Job, dataset: Dataset) -> torch.nn.Module:
        return build_model(
            job.model_name,
            job.spec["model"]["params"],
            input_shape=tuple(dataset.feature_shape),
            n_outputs=get_model(job.model_name).n_outputs(facts_of(dataset)),
            generator=_init_generator(),
        )

    def _starting_model(self, job: Job, dataset: Dataset) -> torch.nn.Module:
        """The built model, loaded with the job's ``model.init`` weights (a new head when the class
        count differs) and frozen as ``training.finetune`` says (training/finetune.py)."""
        model = self._build_model(job, dataset)
        provenance = job.spec.get("init")
        if provenance is None:
            return model
        apply_init(model, init_blob_path(self.db, self.blobs, provenance), new_head=bool(provenance.get("new_head")))
        training = job.spec["training"]
        apply_finetune(
            model, mode=training.get("finetune") or "full", k=training.get("finetune_k"), lora=training.get("lora")
        )
        return model

    def _write_model(self, claimed: Claimed, model: torch.nn.Module, n_outputs: int) -> Path:
        job, dataset = claimed.job, claimed.dataset
        classes = public_class_list(
            task=dataset.task,
            n_classes=dataset.n_classes,
            class_names=dataset.class_names,
            declared=dataset.classes_declared,
        )
        lora = claimed.training.lora
        merged = merge_lora(model)  # LoRA: released as W + (alpha/r)·B·A in the plain architecture
        self.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.settings.tmp_dir, suffix=".safetensors")
        os.close(fd)
        path = Path(name)
        save_model(
            path,
            model.to("cpu"),
            config={
                "format_version": 1,
                "model": {"name": job.model_name, "params": job.spec["model"]["params"]},
                "input_shape": list(dataset.feature_shape),
                "n_outputs": n_outputs,
                "task": dataset.task,
                "job_id": job.id,
                "dataset_id": dataset.id,
                "feature_names": dataset.feature_names,
                # Output i is classes[i]; the features were prepared as declared before training.
                "classes": list(classes.names) if classes is not None else None,
                "preparation": dataset.preparation,
                # A text model's inputs: token ids from this public tokenizer, padded to max_length.
                "text": (
                    {
                        "tokenizer_id": dataset.tokenizer_id,
                        "vocab_size": dataset.vocab_size,
                        "pad_id": dataset.pad_id,
                        "max_length": dataset.feature_shape[0],
                    }
                    if dataset.modality == "text"
                    else None
                ),
                # The released weights: the last iterate, or their moving average (post-processing).
                "ema_decay": claimed.training.ema_decay,
                # How it trained (public choices): augmented views per example, arithmetic.
                "augmult": claimed.training.augmult,
                "precision": claimed.training.precision or "fp32",
                # LoRA fine-tuning: the adapters' rank and alpha; the weights hold them merged.
                "lora": (
                    {"rank": lora.rank, "alpha": lora.alpha, "merged": True} if lora is not None and merged else None
                ),
            },
        )
        return path

    def _rows_per_chunk(self, job: Job, dataset: Dataset, device: torch.device) -> int:
        return rows_per_chunk(
            self.settings, model_name=job.model_name, params=job.spec["model"]["params"], facts=facts_of(dataset),
            device=device,
        )  # fmt: skip

    def _deadline(self, job: Job) -> float:
        """When this attempt must stop (time.monotonic()): the job's time limit, at most the service's."""
        requested = job.spec["training"].get("time_limit_s")
        return time.monotonic() + min(self.settings.job_time_limit_s, requested or self.settings.job_time_limit_s)

    def _hooks(
        self,
        claimed: Claimed,
        checkpoint: Path,
        *,
        model: torch.nn.Module,
        average: ParameterAverage | None,
    ) -> tuple[TrainingHooks, Callable[[], bool]]:
        """Progress, heartbeat, cancel, the time limit and the parameter average (folded in after
        every optimizer step, and before a checkpoint is written so that it holds the step's
        average); returns the hooks and a 'timed out?' probe."""
        job = claimed.job
        every = max(1, job.steps_planned // 100)
        state = {"stop": False, "last_beat": 0.0}
        interval = self.settings.heartbeat_interval_s
        deadline = self._deadline(job)

        def timed_out() -> bool:
            return time.monotonic() > deadline

        def on_step_end(step: int) -> None:
            if average is not None:
                average.advance_to(step, model)
            now = time.monotonic()
            since = now - state["last_beat"]
            due = since >= interval or (step % every == 0 and since >= PROGRESS_MIN_GAP_S)
            if step != job.steps_planned and not due:
                return
            state["last_beat"] = now
            spent = (
                0.0  # a public dataset has no budget: nothing is spent
                if claimed.dataset.public
                else privacy.ledger_epsilon(
                    privacy.rdp_curve(claimed.plan.event_for(job.noise_multiplier, step)), job.delta
                )
            )
            # True once a cancel was asked for, or a newer attempt owns the job: stop quietly.
            state["stop"] = lifecycle.record_progress(
                self.db,
                attempt=claimed.held,
                step=step,
                steps_planned=job.steps_planned,
                epsilon_spent=spent,
            )

        def save(training_state: TrainingState) -> None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            if average is None:
                save_training_state(checkpoint, training_state)
            else:
                average.advance_to(training_state.step, model)
                save_training_state(checkpoint, training_state, extras=average.checkpoint_tensors())
            self.private_files.keep(job.id, CHECKPOINT_SUFFIX)

        hooks = TrainingHooks(
            on_step_end=on_step_end,
            should_stop=lambda: bool(state["stop"]) or timed_out(),
            save_checkpoint=save if self.settings.checkpoint_every_steps else None,
            checkpoint_every=self.settings.checkpoint_every_steps,
        )
        return hooks, timed_out

    # ------------------------------------------------------------------ settlement

    def succeed(self, claimed: Claimed, outcome: Outcome, *, single_job: SingleJobPrefetch | None = None) -> str:
        """Store the model, then commit the charge and write the report in one transaction;
        ``single_job``: the planned run's single-job ε, if it was started while training."""
        assert outcome.model_path is not None
        model_key, model_sha = self.blobs.put_file(outcome.model_path)
        steps_run = outcome.result.steps_run
        actual = claimed.event_json(steps_run, evaluated=True)
        # Numeric accountants may take a while: never under the database write lock.
        release = prepare_release(
            claimed.job,
            dataset=claimed.dataset,
            trained=ReleasedTraining(
                plan=claimed.plan, hyperparameters=claimed.hyperparameters, training=claimed.training
            ),
            actual_event=actual,
            metrics=outcome.metrics,
            model_sha256=model_sha,
            secure_gaussian=self.settings.secure_noise,
            execution=outcome.execution,
            single_job=single_job.result_for(actual) if single_job is not None else None,
        )
        success = lifecycle.Success(
            steps_run=steps_run,
            actual_event=actual,
            model_blob=model_key,
            model_sha256=model_sha,
            metrics=outcome.metrics,
            epsilon_prv=release.single_job.epsilon,
        )
        write_report = functools.partial(released_model_report, release=release)
        if not lifecycle.succeed(
            self.db, attempt=claimed.held, success=success, actor=self.actor, write_report=write_report
        ):
            return self._stale(claimed)
        self._cleanup(claimed.job.id)
        log.info("job succeeded", extra={"job_id": claimed.job.id})
        return JobStatus.SUCCEEDED

    def settle_stopped(self, claimed: Claimed, steps_run: int) -> str:
        """Cancel after TOUCH: commit the steps that ran (no evaluation was released), release the
        rest, and store a report of them (its single-job ε for the steps run, not the plan)."""
        actual = claimed.event_json(steps_run, evaluated=False)
        writer = None
        if not claimed.dataset.public:
            # Numeric accountants may take a while: never under the database write lock.
            single_job = self._single_job_beating(claimed, actual)
            writer = self._ended_report(claimed, committed_event=actual, single_job=single_job)
        if not lifecycle.stop_early(
            self.db,
            attempt=claimed.held,
            steps_run=steps_run,
            actual_event=actual,
            actor=self.actor,
            write_report=writer,
        ):
            return self._stale(claimed)
        self._cleanup(claimed.job.id)
        return JobStatus.CANCELLED

    def fail(self, claimed: Claimed, *, error_code: str) -> None:
        """Commit the whole reservation (the data was opened) with its report."""
        writer = None if claimed.dataset.public else self._ended_report(claimed, committed_event=claimed.job.event)
        if not lifecycle.fail(
            self.db, attempt=claimed.held, error_code=error_code, actor=self.actor, write_report=writer
        ):
            self._stale(claimed)
            return
        self._cleanup(claimed.job.id)

    def _single_job_beating(self, claimed: Claimed, event: dict[str, Any]) -> privacy.SingleJobEpsilon | None:
        """The numeric single-job ε of ``event`` (up to the accountants' time cap, 120 s), with the
        job's heartbeat kept meanwhile: a cancelled job taken for lost would be failed by the
        reconciler and charged its whole reservation instead of the steps it ran. None if it
        failed (the report then takes the closed forms)."""
        pending = SingleJobPrefetch.start(event, delta=claimed.job.delta, algorithm=claimed.job.algorithm).future
        while True:
            try:
                return pending.result(timeout=self.settings.heartbeat_interval_s)
            except FutureTimeout:
                lifecycle.heartbeat(self.db, attempt=claimed.held)
            except Exception:
                log.exception("the single-job epsilon of a cancelled job failed", extra={"job_id": claimed.job.id})
                return None

    def _ended_report(
        self,
        claimed: Claimed,
        *,
        committed_event: dict[str, Any],
        single_job: privacy.SingleJobEpsilon | None = None,
    ) -> EndedReportWriter:
        """The report writer of a job this worker ends without success; its inputs computed now,
        outside the settling transaction (a failure here leaves them to the writer)."""
        secure = self.settings.secure_noise
        rebuilt = (
            None
            if claimed.tuning is not None  # a tuning's mechanism is its pool's, not one plan's
            else RebuiltJob(
                plan=claimed.plan,
                evaluation=claimed.evaluation,
                hyperparameters=claimed.hyperparameters,
                training=claimed.training,
            )
        )
        try:
            inputs = ended_report_inputs(
                claimed.job,
                claimed.dataset,
                committed_event=committed_event,
                single_job=single_job,
                secure_gaussian=secure,
                rebuilt=rebuilt,
            )
        except Exception:
            log.exception("could not prepare an ended job's report", extra={"job_id": claimed.job.id})
            inputs = None
        return EndedReportWriter(inputs, secure_gaussian=secure)

    @staticmethod
    def _stale(claimed: Claimed) -> str:
        log.warning("stale attempt finished; ignoring", extra={"job_id": claimed.job.id, "attempt": claimed.attempt})
        return "stale"
