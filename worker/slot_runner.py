"""A tuning on workers: opening it (drawing its K and each trial's candidate, creating its slots)
and running its slots, each a trial if one is pending then a wait to the slot's end
(worker/tuning_slot.py); the worker that finishes the last slot closes the tuning.

K is secret (worker/tuning.py says why): nothing here logs it or lets a slot's duration or answer
depend on whether it held a trial.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import Rows
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.storage.blobs import StorageUnavailable
from kernel.tuning import slots as tuning_slots
from kernel.tuning import trial_queue
from kernel.tuning.closing import Closer
from kernel.tuning.selection import TrialResult, best_of, score_of
from worker import evaluation as dp_evaluation
from worker import job_data
from worker.claim import Claimed
from worker.context import WorkerContext, device_label, training_device
from worker.holdout_split import coin_count, split_rows
from worker.job_data import JobData
from worker.model_output import write_model
from worker.model_setup import parameter_average, starting_model
from worker.settle import stale
from worker.train import rows_per_chunk
from worker.tuning import trial_count
from worker.tuning_slot import Pacer, SlotClock, SlotTrial, wait_out

__all__ = ["OPENED", "SLOT_DONE", "SlotRunner"]

log = logging.getLogger("privtrain.worker")

OPENED = "opened"
"""What running a tuning's job answers: its trials were drawn and its slots created."""

SLOT_DONE = "done"
"""What a tuning slot's task answers when it was not the last one, whatever it held."""


@dataclass
class _SlotTuning:
    """A tuning as this worker's slots run it: re-derived once, its data loaded at its first trial."""

    claimed: Claimed
    schedule: dict[str, Any]
    data: JobData | None = None


class SlotRunner:
    """A worker's tuning slots; keeps the tuning whose slots it ran last (its data stay loaded
    for the next slot of the same attempt)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.tuning: _SlotTuning | None = None

    def open(self, claimed: Claimed) -> str:
        """Draw the tuning's K (from the OS's CSPRNG, conditioned on its public maximum) and each
        trial's candidate, and create its slots, in one transaction; fair dispatch then sends the
        slots like jobs. Takes the same few milliseconds whatever K is; a retry after a lost worker
        draws afresh (nothing ran)."""
        tuning, job = claimed.tuning, claimed.job
        assert tuning is not None
        stored = claimed.spec.tuning
        assert stored is not None and stored.schedule is not None
        rng = secrets.SystemRandom()
        count = trial_count(tuning.distribution, rng)
        opened = tuning_slots.open_tuning(
            self.ctx.db,
            job_id=job.id,
            attempt=claimed.attempt,
            candidates=[tuning.draw_candidate(rng) for _ in range(count)],
            slots=int(stored.schedule.slots),
        )
        if not opened:
            return stale(claimed)
        self.ctx.send_next()
        return OPENED

    def run_slot(self, job_id: str, *, attempt: int, slot: int) -> str:
        """One slot of a tuning (worker/tuning_slot.py): its trial if one is pending, then the wait
        to the slot's end. The worker that finishes the last slot closes the tuning."""
        ctx = self.ctx
        held = tuning_slots.claim(ctx.db, job_id=job_id, attempt=attempt, slot=slot, worker=ctx.actor)
        if held is None:
            return "skipped"
        ctx.send_next()
        stop = Pacer(ctx.settings.heartbeat_interval_s, check=lambda: tuning_slots.heartbeat(ctx.db, slot=held))
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
        if not tuning_slots.finish(ctx.db, slot=held, outcome=outcome):
            return SLOT_DONE
        self.tuning = None  # the tuning is closing: its data are not needed here any more
        return self.closer().close(job_id=job_id, attempt=attempt)

    def closer(self) -> Closer:
        ctx = self.ctx
        return Closer(
            db=ctx.db,
            blobs=ctx.blobs,
            files=ctx.trial_files,
            secure_gaussian=ctx.settings.secure_noise,
            actor=ctx.actor,
        )

    def _slot_tuning(self, job_id: str, attempt: int) -> _SlotTuning:
        """The tuning as its slots run it, kept from this worker's previous slot of the same attempt."""
        cached = self.tuning
        if cached is not None and cached.claimed.job.id == job_id and cached.claimed.attempt == attempt:
            return cached
        self.tuning = None
        rederived = self.ctx.kernel.tuning(job_id)
        assert rederived.tuning is not None
        self.tuning = _SlotTuning(claimed=Claimed.of(rederived, rederived.job), schedule=rederived.tuning.schedule)
        return self.tuning

    def _slot_trial(self, tuning: _SlotTuning, *, clock: SlotClock, stop: Pacer) -> SlotTrial:
        """Take the next pending trial and run it: stopped at the trial time limit (it then
        releases nothing), its model kept as a private file while it may win."""
        ctx, claimed = self.ctx, tuning.claimed
        assert claimed.tuning is not None
        taken = trial_queue.take(ctx.db, job_id=claimed.job.id, attempt=claimed.attempt, worker=ctx.actor)
        if taken is None:
            return SlotTrial.NONE
        device = training_device()
        if tuning.data is None:
            tuning.data = job_data.load_data_and_units(ctx, claimed.dataset, device)
        data = tuning.data
        ran = self._run_trial(
            claimed,
            taken.candidate,
            X=data.rows,
            y=data.y,
            unit_codes=data.units,
            device=device,
            stop=lambda: stop() or clock.trial_timed_out(),
        )
        if stop.stopped:
            return SlotTrial.STOPPED
        if ran is None:
            trial_queue.lapse(ctx.db, trial=taken)
            return SlotTrial.LAPSED
        metrics, model = ran
        result = TrialResult(
            seq=taken.seq, candidate=taken.candidate, metrics=metrics, score=score_of(metrics, claimed.tuning.metric)
        )
        finished = trial_queue.finished(ctx.db, job_id=claimed.job.id, attempt=claimed.attempt)
        rivals = [TrialResult(seq=t.seq, candidate=t.candidate, metrics=t.metrics, score=t.score) for t in finished]
        name = None
        if best_of([*rivals, result], claimed.tuning.metric) is result:  # else its model is never needed
            name = ctx.trial_files.name(taken)
            written = self._write_trial_model(claimed, taken.candidate, model, class_names=data.class_names)
            ctx.trial_files.keep(name, written)
        recorded = trial_queue.finish(
            ctx.db,
            trial=taken,
            score=result.score,
            metrics=metrics,
            model_file=name,
            device=device_label(device),
        )
        if not recorded:
            ctx.trial_files.discard([name] if name is not None else [])
            return SlotTrial.STOPPED
        return SlotTrial.FINISHED

    def _write_trial_model(
        self, claimed: Claimed, index: int, model: torch.nn.Module, *, class_names: tuple[str, ...] | None
    ) -> Path:
        """Candidate ``index``'s trained model as the artifact its job would release."""
        assert claimed.tuning is not None
        selected = claimed.tuning.candidates[index]
        chosen = dataclasses.replace(claimed, spec=selected.stored.spec, training=selected.rebuilt.training)
        return write_model(self.ctx, claimed=chosen, model=model, class_names=class_names)

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
        ctx = self.ctx
        assert claimed.tuning is not None
        candidate = claimed.tuning.candidates[index]
        evaluation = candidate.rebuilt.evaluation
        assert evaluation is not None  # a tuning's base has an evaluation block
        coins = dp_evaluation.holdout_mask(
            coin_count(X.n_rows, unit_codes),
            evaluation.holdout_fraction,
            dp_evaluation.secure_random(secure_gaussian=ctx.settings.secure_noise).numpy,
        )
        split = split_rows(X, y, unit_codes, coins, device=device)
        spec = candidate.stored.spec
        model = starting_model(
            ctx, model_name=claimed.job.model_name, spec=spec, dataset=claimed.dataset, n_outputs=claimed.n_outputs
        )
        average = parameter_average(candidate.rebuilt.training, model, Path(os.devnull), None)

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
                max_physical_batch_size=rows_per_chunk(
                    ctx.settings,
                    model_name=claimed.job.model_name,
                    params=spec.model.params,
                    facts=claimed.facts,
                    device=device,
                ),
                generator=SecureRandom.from_os_entropy(device, secure_gaussian=ctx.settings.secure_noise),
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
            secure_gaussian=ctx.settings.secure_noise,
            row_weights=split.eval_weights,
        )
        return metrics, model
