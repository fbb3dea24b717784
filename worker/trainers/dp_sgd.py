"""The dp-sgd trainer: Abadi clipping through the shared per-sample-map trainer."""

from __future__ import annotations

from app.algorithms.dp_sgd import DPSGD, DPSGDHyperparameters
from app.algorithms.registry import definition_of
from worker.optimizers.per_sample import AbadiClip
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_trainer
from worker.trainers.per_sample_map import run_with_per_sample_map


@register_trainer(DPSGD)
def run_dp_sgd(request: TrainingRequest[DPSGDHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    return run_with_per_sample_map(
        definition_of(DPSGD),
        request,
        AbadiClip(hyper.clipping_norm),
        optimizer="sgd",
        momentum=hyper.momentum,
        weight_decay=hyper.weight_decay,
    )
