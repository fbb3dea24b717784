"""Training one job's attempt: its data split, its starting (or resumed) model, the trainer of its
algorithm with the hooks that record progress, keep the heartbeat, honour a cancel and the time
limit and write checkpoints; then the DP evaluation and the released model file.

The noise comes from a SecureRandom drawn from OS entropy; its state and the hold-out split are
secret (worker storage only, never in a log line, event, report or model artifact).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from algorithms import get_algorithm
from algorithms.trainers import TrainingRequest, get_trainer
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.randomness.secure_random import SecureRandom
from kernel.config import Settings
from kernel.datasets.facts import DatasetFacts
from kernel.job_run import Execution, chunk_rows
from kernel.jobs.private_files import CHECKPOINT_SUFFIX, HOLDOUT_SUFFIX
from training.artifacts import save_training_state
from training.ema import ParameterAverage
from worker import evaluation as dp_evaluation
from worker import job_data
from worker.claim import Claimed
from worker.context import WorkerContext, device_label, training_device
from worker.holdout_split import coin_count, split_rows
from worker.model_output import write_model
from worker.model_setup import parameter_average, resumable, starting_model

__all__ = ["PROGRESS_MIN_GAP_S", "Outcome", "rows_per_chunk", "train"]

PROGRESS_MIN_GAP_S = 0.5
"""Progress is written every 1% of the steps, the heartbeat interval and the last step, but never
twice within this gap (except the last step): each write is a database transaction and an ε
computation, which a short job on a GPU, at milliseconds a step, would otherwise pay every step."""


@dataclass(frozen=True)
class Outcome:
    result: TrainingResult
    model_path: Path | None
    metrics: dict[str, object] | None
    timed_out: bool = False
    execution: Execution | None = None
    """Where and how long the attempt that finished trained (the report's execution section)."""


def _device_memory_bytes(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).total_memory)


def rows_per_chunk(
    settings: Settings, *, model_name: str, params: dict[str, Any], facts: DatasetFacts, device: torch.device
) -> int:
    """Rows per per-sample-gradient chunk a worker with ``settings`` uses for the model on ``device``
    (bounds memory, never results): on a GPU, larger chunks in a share of its memory
    (ModelSizeLimits.for_gpu). ``params`` must be valid for the model."""
    memory = _device_memory_bytes(device) if device.type == "cuda" else None
    return chunk_rows(settings, model_name=model_name, params=params, facts=facts, device_memory_bytes=memory)


def _keep_private(ctx: WorkerContext, job_id: str, suffix: str) -> None:
    """A private file just written (the hold-out split, a checkpoint) is copied to the store's
    private area, so that a retried attempt on another host resumes from it."""
    ctx.kernel.keep(job_id, suffix)


def train(ctx: WorkerContext, claimed: Claimed) -> Outcome:
    job, dataset = claimed.job, claimed.dataset
    device = training_device()
    data = job_data.load_data_and_units(ctx, dataset, device)
    X, y, unit_codes = data.rows, data.y, data.units
    if unit_codes is not None and not get_algorithm(job.algorithm).privacy_units:
        raise ValueError(f"algorithm {job.algorithm} does not train per privacy unit")  # submission refuses it
    private = ctx.kernel.private_state(job.id, evaluated=claimed.evaluation is not None)
    coins = None
    if claimed.evaluation is not None:
        coins = dp_evaluation.load_or_draw_holdout(
            private.holdout, coin_count(X.n_rows, unit_codes), claimed.evaluation.holdout_fraction
        )
        _keep_private(ctx, job.id, HOLDOUT_SUFFIX)
    split = split_rows(X, y, unit_codes, coins, device=device)
    X, y, units = split.X, split.y, split.units
    model = starting_model(
        ctx, model_name=job.model_name, spec=claimed.spec, dataset=dataset, n_outputs=claimed.n_outputs
    )
    checkpoint = private.checkpoint
    resume = resumable(job.id, checkpoint, device)
    average = parameter_average(claimed.training, model, checkpoint, resume)
    hooks, timed_out = _hooks(ctx, claimed, checkpoint, model=model, average=average)
    params = claimed.spec.model.params
    chunk = rows_per_chunk(ctx.settings, model_name=job.model_name, params=params, facts=claimed.facts, device=device)
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
            max_physical_batch_size=chunk,
            generator=SecureRandom.from_os_entropy(device, secure_gaussian=ctx.settings.secure_noise),
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
    execution = Execution(
        device=device_label(device),
        steps=result.steps_run - (resume.step if resume is not None else 0),
        seconds=time.perf_counter() - started,
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
            secure_gaussian=ctx.settings.secure_noise,
            row_weights=split.eval_weights,
        )
    return Outcome(
        result=result,
        model_path=write_model(ctx, claimed=claimed, model=model, class_names=data.class_names),
        metrics=metrics,
        execution=execution,
    )


def _deadline(ctx: WorkerContext, claimed: Claimed) -> float:
    """When this attempt must stop (time.monotonic()): the job's time limit, at most the service's."""
    requested = claimed.spec.training.time_limit_s
    limit = ctx.settings.job_time_limit_s
    return time.monotonic() + min(limit, requested or limit)


def _hooks(
    ctx: WorkerContext,
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
    interval = ctx.settings.heartbeat_interval_s
    deadline = _deadline(ctx, claimed)

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
        # True once a cancel was asked for, or a newer attempt owns the job: stop quietly.
        state["stop"] = ctx.kernel.progress(
            attempt=claimed.held, plan=claimed.plan, job=job, public=claimed.dataset.public, step=step
        )

    def save(training_state: TrainingState) -> None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        if average is None:
            save_training_state(checkpoint, training_state)
        else:
            average.advance_to(training_state.step, model)
            save_training_state(checkpoint, training_state, extras=average.checkpoint_tensors())
        _keep_private(ctx, job.id, CHECKPOINT_SUFFIX)

    hooks = TrainingHooks(
        on_step_end=on_step_end,
        should_stop=lambda: bool(state["stop"]) or timed_out(),
        save_checkpoint=save if ctx.settings.checkpoint_every_steps else None,
        checkpoint_every=ctx.settings.checkpoint_every_steps,
    )
    return hooks, timed_out
