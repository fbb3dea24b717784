"""The shared trainer of every per-sample-map algorithm (dp-sgd, dp-adam, auto-s, dp-psac).

It runs the DP loop with the job's charged σ, q and steps, the public expected batch size B as the
normaliser, and a per-sample map whose bound S must equal the sensitivity the catalogue charged:
the noise drawn per step is N(0, σ²S² I) on the sum. With ``training.augmult`` = K each sampled
image's per-sample gradient is the mean over K augmented views (dp/loop/augmult.py), mapped
as one row: S, and so the charge, does not depend on K. On a dataset with a privacy unit column the
loop samples units, and each unit's gradient is the mean over its ``training.rows_per_unit`` row
slots, mapped as one (dp/loop/units.py): S bounds a unit's contribution.
"""

from __future__ import annotations

from typing import Literal

from algorithms.registry import H, PoissonGaussianAlgorithm
from algorithms.trainers import TrainingRequest
from algorithms.training_fields import learning_rate_of
from dp.loop.augmult import with_augmult
from dp.loop.batch_loop import DPSGDConfig, per_sample_map_aggregator, train_dp_sgd
from dp.loop.state import TrainingResult
from dp.loop.units import unit_sampling
from dp.per_example.per_sample import PerSampleMap


def run_with_per_sample_map(
    algorithm: PoissonGaussianAlgorithm[H],
    request: TrainingRequest[H],
    per_sample_map: PerSampleMap,
    *,
    optimizer: Literal["sgd", "adam"],
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    adam_betas: tuple[float, float] = (0.9, 0.999),
    adam_eps: float = 1e-8,
) -> TrainingResult:
    charged = algorithm.sensitivity(request.hyperparameters)
    if per_sample_map.norm_bound != charged:
        raise RuntimeError(f"{algorithm.name}: the per-sample map's bound differs from the charged sensitivity")
    config = DPSGDConfig(
        steps=request.steps,
        sampling_probability=request.sampling_probability,
        noise_multiplier=request.noise_multiplier,
        clipping_norm=per_sample_map.norm_bound,
        learning_rate=learning_rate_of(request.training),
        momentum=momentum,
        weight_decay=weight_decay,
        loss=request.loss,
        max_physical_batch_size=request.max_physical_batch_size,
        optimizer=optimizer,
        adam_betas=adam_betas,
        adam_eps=adam_eps,
        expected_batch_size=request.expected_batch_size,
    )
    aggregator, units = unit_sampling(
        with_augmult(
            per_sample_map_aggregator(request.model, per_sample_map, precision=request.training.precision or "fp32"),
            request.training.augmult,
        ),
        request.units,
        rows_per_unit=request.training.rows_per_unit,
    )
    return train_dp_sgd(
        request.model,
        request.features,
        request.y,
        config=config,
        generator=request.generator,
        hooks=request.hooks,
        resume_from=request.resume_from,
        device=request.device,
        aggregator=aggregator,
        units=units,
    )
