"""The dp-sgd trainer: Abadi clipping through the shared per-sample-map trainer."""

from __future__ import annotations

from app.algorithms.dp_sgd import DPSGDHyperparameters
from worker.optimizers.per_sample import AbadiClip
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_trainer
from worker.trainers.per_sample_map import hyperparameters_of, run_with_per_sample_map


@register_trainer("dp-sgd")
def run_dp_sgd(request: TrainingRequest) -> TrainingResult:
    hyper = hyperparameters_of("dp-sgd", request)
    assert isinstance(hyper, DPSGDHyperparameters)
    return run_with_per_sample_map(
        "dp-sgd", request, hyper, AbadiClip(hyper.clipping_norm),
        optimizer="sgd", momentum=hyper.momentum, weight_decay=hyper.weight_decay,
    )
