"""The model a job starts training from: built fresh, loaded with its ``model.init`` weights and
frozen as its fine-tuning mode says, or resumed from its checkpoint; and the released weights'
parameter average.

Model initialisation is data-independent (non-private): it draws from its own generator, never
from the job's SecureRandom noise stream.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from dp.loop.state import TrainingState
from dp.randomness.secure_random import SecureRandom
from kernel.db.orm import Dataset
from kernel.schemas.jobs import TrainingSpec
from kernel.schemas.stored_spec import StoredJobSpec
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_checkpoint_extras, load_training_state
from training.ema import ParameterAverage
from training.finetune import apply_finetune
from training.init_weights import apply_init, init_blob_path
from worker.context import WorkerContext

__all__ = ["fresh_model", "parameter_average", "resumable", "starting_model"]

log = logging.getLogger("privtrain.worker")


def _init_generator() -> torch.Generator:
    """Model initialisation's own generator (non-private: init is data-independent).

    Deliberately a plain torch.Generator, separate from the job's SecureRandom, so building the
    model never consumes or shares the noise stream; OS-seeded only so jobs do not all start alike.
    """
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))


def fresh_model(model_name: str, params: dict[str, Any], dataset: Dataset, n_outputs: int) -> torch.nn.Module:
    return build_model(
        model_name,
        params,
        input_shape=tuple(dataset.feature_shape),
        n_outputs=n_outputs,
        generator=_init_generator(),
    )


def starting_model(
    ctx: WorkerContext, *, model_name: str, spec: StoredJobSpec, dataset: Dataset, n_outputs: int
) -> torch.nn.Module:
    """The built model of ``spec`` (a job's, or a tuning candidate's), loaded with its
    ``model.init`` weights (a new head when the class count differs) and frozen as
    ``training.finetune`` says (training/finetune.py)."""
    model = fresh_model(model_name, spec.model.params, dataset, n_outputs)
    provenance = spec.init
    if provenance is None:
        return model
    apply_init(model, init_blob_path(ctx.db, ctx.blobs, provenance.to_json()), new_head=bool(provenance.new_head))
    training = spec.training
    apply_finetune(
        model,
        mode=training.finetune or "full",
        k=training.finetune_k,
        lora=training.lora.to_json() if training.lora is not None else None,
    )
    return model


def parameter_average(
    training: TrainingSpec, model: torch.nn.Module, checkpoint: Path, resume: TrainingState | None
) -> ParameterAverage | None:
    """The average of ``training.ema_decay`` (None when off), continued from the checkpoint on resume."""
    if training.ema_decay is None:
        return None
    average = ParameterAverage(model, decay=training.ema_decay)
    if resume is not None:
        average.restore(load_checkpoint_extras(checkpoint), step=resume.step)
    return average


def resumable(job_id: str, checkpoint: Path, device: torch.device) -> TrainingState | None:
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
