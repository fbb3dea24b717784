"""The dp-sgd trainer: Abadi clipping through the shared per-sample-map trainer."""

from __future__ import annotations

from algorithms.dp_sgd.definition import DPSGD, DPSGDHyperparameters
from algorithms.dp_sgd_loop import OptimizerChoice, run_with_per_sample_map
from algorithms.registry import definition_of
from algorithms.trainers import TrainingRequest, register_trainer
from dp.loop.state import TrainingResult
from dp.per_example.per_sample import AbadiClip


@register_trainer(DPSGD)
def run_dp_sgd(request: TrainingRequest[DPSGDHyperparameters]) -> TrainingResult:
    hyper = request.hyperparameters
    return run_with_per_sample_map(
        definition_of(DPSGD),
        request,
        AbadiClip(hyper.clipping_norm),
        optimizer=OptimizerChoice("sgd", momentum=hyper.momentum, weight_decay=hyper.weight_decay),
    )
