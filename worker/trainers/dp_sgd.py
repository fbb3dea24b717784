"""The dp-sgd trainer: the job's charged σ, q and steps go straight into the DP-SGD loop."""

from __future__ import annotations

from worker.optimizers.dp_sgd import DPSGDConfig, train_dp_sgd
from worker.optimizers.state import TrainingResult
from worker.trainers.base import TrainingRequest, register_trainer


@register_trainer("dp-sgd")
def run_dp_sgd(request: TrainingRequest) -> TrainingResult:
    hyper = request.spec["algorithm"]["hyperparameters"]
    config = DPSGDConfig(
        steps=request.steps,
        sampling_probability=request.sampling_probability,
        noise_multiplier=request.noise_multiplier,
        clipping_norm=float(hyper["clipping_norm"]),
        learning_rate=float(request.spec["training"]["learning_rate"]),
        momentum=float(hyper["momentum"]),
        weight_decay=float(hyper["weight_decay"]),
        loss="cross_entropy" if request.task == "classification" else "mse",
        max_physical_batch_size=request.max_physical_batch_size,
        expected_batch_size=request.expected_batch_size,
    )
    return train_dp_sgd(
        request.model,
        request.X,
        request.y,
        config=config,
        generator=request.generator,
        hooks=request.hooks,
        resume_from=request.resume_from,
        device=request.device,
    )
