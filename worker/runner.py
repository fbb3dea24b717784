"""A job's life on a worker: claim → touch → train → write artifacts → commit.

Every state change is one database transaction that first locks the dataset's budget row, so the
job row and the ledger always move together. Errors shown to users are generic codes; the
traceback goes to the operator log only (privacy.md §1).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from sqlalchemy import update

from app import ledger, privacy
from app.algorithms import PrivacyPlan, get_algorithm
from app.config import Settings
from app.db import Database
from app.ingest import IngestLimits, parse_dataset
from app.job_planning import facts_of
from app.job_views import add_job_event
from app.model_catalogue import get_model
from app.models import Dataset, Job, utcnow
from app.schemas.jobs import TrainingSpec
from app.storage import BlobStore
from worker.optimizers.dp_sgd import secure_generator
from worker.optimizers.state import TrainingHooks, TrainingResult, TrainingState
from worker.report import build_report
from worker.trainers import TrainingRequest, get_trainer
from worker.training.artifacts import load_training_state, save_model, save_training_state
from worker.training.models import build_model

log = logging.getLogger("privtrain.worker")


class JobCancelled(Exception):
    pass


@dataclass(frozen=True)
class Claimed:
    job: Job
    dataset: Dataset
    plan: PrivacyPlan


def _actor() -> str:
    return f"worker:{socket.gethostname()}:{os.getpid()}"


def replan(job: Job, dataset: Dataset) -> PrivacyPlan:
    """Rebuild the plan from the stored spec; the worker refuses a job whose charge differs."""
    algorithm = get_algorithm(job.algorithm)
    hyper = algorithm.validate_hyperparameters(job.spec["algorithm"]["hyperparameters"])
    training = TrainingSpec.model_validate(job.spec["training"])
    plan = algorithm.plan(hyper, training, facts_of(dataset))
    charged = privacy.event_to_json(plan.event(job.noise_multiplier))
    if charged != job.event or plan.steps != job.steps_planned:
        raise RuntimeError("the job's stored event differs from its re-derived plan")
    return plan


class JobRunner:
    def __init__(self, settings: Settings, *, db: Database | None = None) -> None:
        self.settings = settings
        self.db = db or Database(settings.resolved_database_url)
        self.blobs = BlobStore(settings.blob_dir, settings.tmp_dir)
        self.actor = _actor()

    # ------------------------------------------------------------------ lifecycle steps

    def claim(self, job_id: str) -> Claimed | None:
        """queued → running (attempt + 1) and TOUCH, in one transaction; None if not claimable."""
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            if job is None:
                log.warning("unknown job", extra={"job_id": job_id})
                return None
            dataset_id = job.dataset_id
        with self.db.write_transaction() as tx:
            budget = ledger.lock_budget(tx, dataset_id)
            claimed = tx.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == "queued", Job.cancel_requested.is_(False))
                .values(
                    status="running",
                    attempt=Job.attempt + 1,
                    started_at=utcnow(),
                    heartbeat_at=utcnow(),
                )
            ).rowcount
            if claimed != 1:
                log.info("job not claimable", extra={"job_id": job_id})
                return None
            job = tx.get(Job, job_id, populate_existing=True)
            dataset = tx.get(Dataset, dataset_id)
            assert job is not None and dataset is not None
            try:
                plan = replan(job, dataset)
            except Exception:
                log.exception("refusing a job whose charge cannot be re-derived", extra={"job_id": job_id})
                ledger.release(tx, budget, job=job, actor=self.actor, reason="failed: plan-mismatch")
                job.status, job.error_code, job.finished_at = "failed", "plan-mismatch", utcnow()
                add_job_event(tx, job.id, "failed", {"error_code": "plan-mismatch"})
                return None
            ledger.touch(tx, budget, job=job, actor=self.actor)
            job.touched_at = utcnow()
            add_job_event(tx, job.id, "started", {"attempt": job.attempt, "steps_planned": job.steps_planned})
        return Claimed(job=job, dataset=dataset, plan=plan)

    def run(self, job_id: str) -> str:
        claimed = self.claim(job_id)
        if claimed is None:
            return "skipped"
        job = claimed.job
        try:
            result, model_path = self._train(claimed)
        except Exception:
            log.exception("job failed", extra={"job_id": job.id})
            self.fail(job.id, error_code="training-failed")
            return "failed"
        try:
            if result.stopped_early:
                self.settle_cancelled(claimed, result.steps_run)
                return "cancelled"
            self.succeed(claimed, result.steps_run, model_path)
            return "succeeded"
        except Exception:
            log.exception("finishing the job failed", extra={"job_id": job.id})
            self.fail(job.id, error_code="artifact-write-failed")
            return "failed"
        finally:
            model_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ training

    def _load_data(self, dataset: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        parsed = parse_dataset(
            self.blobs.path(dataset.blob_key),
            fmt=dataset.format,
            label_column=dataset.label_column,
            task=dataset.task,
            limits=IngestLimits(max_rows=self.settings.max_rows, max_features=self.settings.max_features),
        )
        return torch.from_numpy(parsed.X), torch.from_numpy(parsed.y)

    def _checkpoint_path(self, job_id: str) -> Path:
        return self.settings.checkpoint_dir / f"{job_id}.safetensors"

    def _train(self, claimed: Claimed) -> tuple[TrainingResult, Path]:
        job, dataset = claimed.job, claimed.dataset
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        X, y = self._load_data(dataset)
        model_def = get_model(job.model_name)
        n_outputs = model_def.n_outputs(facts_of(dataset))
        model_params = job.spec["model"]["params"]
        input_shape = tuple(dataset.feature_shape)
        generator = secure_generator(device)
        init_generator = secure_generator("cpu")
        model = build_model(
            job.model_name, model_params, input_shape=input_shape, n_outputs=n_outputs,
            generator=init_generator,
        )
        checkpoint = self._checkpoint_path(job.id)
        resume: TrainingState | None = load_training_state(checkpoint) if checkpoint.exists() else None
        hooks = self._hooks(claimed, checkpoint)
        trainer = get_trainer(job.algorithm)
        result = trainer(
            TrainingRequest(
                model=model, X=X, y=y, task=dataset.task, spec=job.spec,
                noise_multiplier=job.noise_multiplier,
                sampling_probability=job.sampling_probability,
                steps=job.steps_planned,
                max_physical_batch_size=self.settings.max_physical_batch_size,
                generator=generator, hooks=hooks, resume_from=resume, device=device,
            )
        )
        self.settings.tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.settings.tmp_dir, suffix=".safetensors")
        os.close(fd)
        model_path = Path(name)
        save_model(
            model_path,
            model.to("cpu"),
            config={
                "format_version": 1,
                "model": {"name": job.model_name, "params": model_params},
                "input_shape": list(input_shape),
                "n_outputs": n_outputs,
                "task": dataset.task,
                "job_id": job.id,
                "dataset_id": dataset.id,
                "feature_names": dataset.feature_names,
            },
        )
        checkpoint.unlink(missing_ok=True)
        return result, model_path

    def _hooks(self, claimed: Claimed, checkpoint: Path) -> TrainingHooks:
        job, plan = claimed.job, claimed.plan
        every = max(1, job.steps_planned // 100)
        state = {"cancel": False, "last_beat": 0.0}
        interval = self.settings.heartbeat_interval_s

        def on_step_end(step: int) -> None:
            now = time.monotonic()
            if step % every and step != job.steps_planned and now - state["last_beat"] < interval:
                return
            state["last_beat"] = now
            spent = privacy.ledger_epsilon(
                privacy.rdp_curve(plan.event_for(job.noise_multiplier, step)), job.delta
            )
            with self.db.write_transaction() as tx:
                tx.execute(
                    update(Job).where(Job.id == job.id).values(steps_run=step, heartbeat_at=utcnow())
                )
                add_job_event(
                    tx, job.id, "progress",
                    {"step": step, "steps_planned": job.steps_planned, "epsilon_spent": spent},
                )
                current = tx.get(Job, job.id, populate_existing=True)
                state["cancel"] = bool(current is not None and current.cancel_requested)

        def save(training_state: TrainingState) -> None:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            save_training_state(checkpoint, training_state)

        return TrainingHooks(
            on_step_end=on_step_end,
            should_stop=lambda: bool(state["cancel"]),
            save_checkpoint=save if self.settings.checkpoint_every_steps else None,
            checkpoint_every=self.settings.checkpoint_every_steps,
        )

    # ------------------------------------------------------------------ settlement

    def succeed(self, claimed: Claimed, steps_run: int, model_path: Path) -> None:
        model_key, model_sha = self.blobs.put_file(model_path)
        with self.db.write_transaction() as tx:
            budget = ledger.lock_budget(tx, claimed.dataset.id)
            job = tx.get(Job, claimed.job.id, populate_existing=True)
            assert job is not None
            if job.status != "running" or job.attempt != claimed.job.attempt:
                log.warning("stale attempt finished; ignoring", extra={"job_id": job.id})
                return
            before = ledger.budget_summary(budget)
            job.steps_run = steps_run
            actual = privacy.event_to_json(claimed.plan.event_for(job.noise_multiplier, steps_run))
            entry = ledger.commit(tx, budget, job=job, actual_event=actual, actor=self.actor, reason="succeeded")
            tx.flush()
            after = ledger.budget_summary(budget)
            report = build_report(
                job=job,
                dataset=claimed.dataset,
                sensitivity=claimed.plan.sensitivity,
                expected_batch_size=claimed.plan.expected_batch_size,
                actual_event=actual,
                budget_before=before,
                budget_after=after,
                commit_entry_hash=entry.hash,
                commit_entry_seq=entry.seq,
                model_sha256=model_sha,
            )
            report_key, _ = self.blobs.put_bytes(json.dumps(report, indent=2, allow_nan=False).encode())
            job.status = "succeeded"
            job.model_blob, job.model_sha256, job.report_blob = model_key, model_sha, report_key
            job.finished_at = utcnow()
            add_job_event(
                tx, job.id, "succeeded",
                {"steps_run": steps_run, "epsilon_spent": report["epsilon"]["ledger"]},
            )
        log.info("job succeeded", extra={"job_id": claimed.job.id})

    def settle_cancelled(self, claimed: Claimed, steps_run: int) -> None:
        """Cancel after TOUCH: commit the steps that ran, release the rest."""
        with self.db.write_transaction() as tx:
            budget = ledger.lock_budget(tx, claimed.dataset.id)
            job = tx.get(Job, claimed.job.id, populate_existing=True)
            assert job is not None
            job.steps_run = steps_run
            actual = privacy.event_to_json(claimed.plan.event_for(job.noise_multiplier, steps_run))
            ledger.commit(tx, budget, job=job, actual_event=actual, actor=self.actor, reason="cancelled")
            job.status = "cancelled"
            job.finished_at = utcnow()
            add_job_event(tx, job.id, "cancelled", {"steps_run": steps_run})
        self._checkpoint_path(claimed.job.id).unlink(missing_ok=True)

    def fail(self, job_id: str, *, error_code: str) -> None:
        """A failure after TOUCH commits the full reservation (the data was opened); before, releases."""
        with self.db.read_session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            dataset_id = job.dataset_id
        with self.db.write_transaction() as tx:
            budget = ledger.lock_budget(tx, dataset_id)
            job = tx.get(Job, job_id, populate_existing=True)
            assert job is not None
            if job.status != "running":
                return
            if job.touched_at is not None:
                ledger.commit(tx, budget, job=job, actual_event=job.event, actor=self.actor, reason=f"failed: {error_code}")
            else:
                ledger.release(tx, budget, job=job, actor=self.actor, reason=f"failed: {error_code}")
            job.status = "failed"
            job.error_code = error_code
            job.finished_at = utcnow()
            add_job_event(tx, job.id, "failed", {"error_code": error_code})
        self._checkpoint_path(job_id).unlink(missing_ok=True)
