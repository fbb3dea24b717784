"""DP-SGD (Abadi et al. 2016) with Poisson subsampling — the loop the API charges for.

Privacy (add/remove neighbours, docs/privacy-model.md#neighbours). Each step t:

1. B_t = Poisson sample: every row independently with probability q.
2. s_t = Σ_{i∈B_t} clip_C(g_i), clip_C(g) = g · min(1, C/||g||), ||·|| the flat L2 norm over all
   trainable parameters. Adding or removing one row changes s_t by one clipped term, so the
   add/remove L2 sensitivity of s_t is C (no factor 2: that is replace-one).
3. Release s_t + N(0, σ²C² I): one Gaussian vector per step, from the job's SecureRandom.
   Steps 1-3 are the Poisson-subsampled Gaussian mechanism with noise multiplier σ and rate q,
   composed T = `steps` times, which is exactly the event the API charged.
4. Divide by the PUBLIC expected batch size q·n (never |B_t|) and take an SGD step with
   momentum / weight decay: post-processing of released values and the public n.

Nothing private is logged or returned: the result holds only the public step count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.profiler import record_function

from dp.data.rows import Rows, as_rows
from dp.data.units import UnitIndex
from dp.loop.state import TrainingHooks, TrainingResult, TrainingState
from dp.loop.steps import LiveState, run_steps
from dp.losses import LOSS_REGISTRY
from dp.per_example.aggregator import BatchAggregator, BatchContext, MapAggregator, TensorDict
from dp.per_example.ghost import GhostClipAggregator
from dp.per_example.ghost import supports as ghost_supports
from dp.per_example.per_sample import (
    AbadiClip,
    PerSampleMap,
    check_supported,
    clipped_grad_sum,
    trainable_parameters,
)
from dp.precision import Precision, check_precision
from dp.randomness.noise import privatise_sum
from dp.randomness.sampling import poisson_sample
from dp.randomness.secure_random import SecureRandom

__all__ = [
    "BatchAggregator",
    "BatchContext",
    "DPSGDConfig",
    "PerSampleMapAggregator",
    "TrainingHooks",
    "TrainingResult",
    "TrainingState",
    "UnitSampling",
    "per_sample_map_aggregator",
    "train_dp_sgd",
]


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class DPSGDConfig:
    """The hyperparameters the privacy event was computed from (plus post-processing ones)."""

    steps: int
    sampling_probability: float
    """q: each row is in a step's batch independently with this probability."""
    noise_multiplier: float
    """σ: the noise std on the SUM of clipped per-sample gradients is σ·C."""
    clipping_norm: float
    """C: the per-sample flat L2 clipping norm, the add/remove sensitivity of the sum."""
    learning_rate: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    loss: str = "cross_entropy"
    """A registered loss (dp/losses.py), chosen by `loss_for_task`."""
    max_physical_batch_size: int = 256
    """Rows per per-sample-gradient chunk: bounds memory only, never changes the result."""
    optimizer: Literal["sgd", "adam"] = "sgd"
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    expected_batch_size: float | None = None
    """The public normaliser q·m. Default q·len(X); a job that holds rows out for evaluation
    passes q·(1 − f)·n, because the realised number of training rows is not public."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {self.steps!r}")
        q = self.sampling_probability
        if not (_finite(q) and 0.0 < q <= 1.0):
            raise ValueError(f"sampling_probability must be in (0, 1], got {q!r}")
        if not (_finite(self.noise_multiplier) and self.noise_multiplier >= 0.0):
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}")
        if not (_finite(self.clipping_norm) and self.clipping_norm > 0.0):
            raise ValueError(f"clipping_norm must be finite and > 0, got {self.clipping_norm!r}")
        if not (_finite(self.learning_rate) and self.learning_rate > 0.0):
            raise ValueError(f"learning_rate must be finite and > 0, got {self.learning_rate!r}")
        if not (_finite(self.momentum) and 0.0 <= self.momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not (_finite(self.weight_decay) and self.weight_decay >= 0.0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.loss not in LOSS_REGISTRY:
            raise ValueError(f"unknown loss {self.loss!r}; known: {sorted(LOSS_REGISTRY)}")
        mpbs = self.max_physical_batch_size
        if isinstance(mpbs, bool) or not isinstance(mpbs, int) or mpbs < 1:
            raise ValueError(f"max_physical_batch_size must be an integer >= 1, got {mpbs!r}")
        ebs = self.expected_batch_size
        if ebs is not None and not (_finite(ebs) and ebs > 0.0):
            raise ValueError(f"expected_batch_size must be finite and > 0, got {ebs!r}")


@dataclass(frozen=True)
class UnitSampling:
    """Per privacy unit: each step samples units (Poisson, rate q over ``index.n_units``) and gives
    the aggregator ``rows_per_unit`` row slots of each (dp/data/units.py), as a (b, k, ...)
    batch; the aggregator must average each unit's slots before its per-sample map
    (dp/loop/units.py)."""

    index: UnitIndex
    rows_per_unit: int


@dataclass(frozen=True)
class PerSampleMapAggregator(MapAggregator):
    """Σ_i scale_i·g_i for a per-sample map (Abadi clipping, Auto-S, PSAC, ...) on the vmap engine;
    `precision` "bf16" runs the forward under bf16 autocast with float32 norms and sums (dp/precision.py)."""

    precision: Precision = "fp32"

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        return clipped_grad_sum(
            model,
            X,
            y,
            loss=context.loss,
            per_sample_map=self.per_sample_map,
            max_physical_batch_size=context.max_physical_batch_size,
            precision=self.precision,
        )


def per_sample_map_aggregator(
    model: nn.Module, per_sample_map: PerSampleMap, *, precision: Precision = "fp32"
) -> BatchAggregator:
    """Ghost clipping where it is exact for every layer of `model`, else the vmap engine.

    Same sum and same sensitivity (the map's norm bound); only the arithmetic differs. Chosen by
    bench/engine_compare.py (docs/benchmarks.md): 1.3–1.4× a non-private step on CPU against
    1.7–18× for materialised per-sample gradients. Both engines take `precision` ("bf16": bf16
    autocast forward, float32 norms and sums; the ghost engine then uses its default pass 2, "bk").
    """
    check_precision(precision)
    if ghost_supports(model):
        return GhostClipAggregator(per_sample_map, precision=precision)
    return PerSampleMapAggregator(per_sample_map, precision=precision)


def _make_optimizer(params: list[nn.Parameter], config: DPSGDConfig) -> torch.optim.Optimizer:
    """SGD or Adam on the privatised gradient: post-processing, no privacy effect."""
    if config.optimizer == "adam":
        return torch.optim.Adam(
            params,
            lr=config.learning_rate,
            betas=config.adam_betas,
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
    return torch.optim.SGD(params, lr=config.learning_rate, momentum=config.momentum, weight_decay=config.weight_decay)


def _batch(
    rows: Rows, y: torch.Tensor, batch: torch.Tensor, *, units: UnitSampling | None, generator: SecureRandom
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled rows and targets; per unit, the (b, k, ...) row slots of the sampled units."""
    if units is None:
        return rows.take(batch), y[batch.to(y.device)]
    slots = units.index.slots(batch, rows_per_unit=units.rows_per_unit, generator=generator)
    flat = slots.reshape(-1)
    features = rows.take(flat).reshape(*slots.shape, *rows.row_shape)
    targets = y[flat.to(y.device)].reshape(*slots.shape, *y.shape[1:])
    return features, targets


def train_dp_sgd(
    model: nn.Module,
    X: torch.Tensor | Rows,
    y: torch.Tensor,
    *,
    config: DPSGDConfig,
    generator: SecureRandom,
    hooks: TrainingHooks | None = None,
    resume_from: TrainingState | None = None,
    device: torch.device | None = None,
    aggregator: BatchAggregator | None = None,
    units: UnitSampling | None = None,
) -> TrainingResult:
    """Train `model` in place with DP-SGD for `config.steps` steps in total.

    With ``units`` (a dataset whose privacy unit is a person), steps sample units instead of
    rows and the aggregator receives each sampled unit's row slots (see `UnitSampling`); q, the
    expected batch size and the sensitivity are then per unit, and nothing else changes.

    `generator` supplies both the Poisson sampling and the noise (`SecureRandom.from_os_entropy`
    on the model's device in production; `SecureRandom.from_seed` in tests only). X is a tensor or a
    `Rows` (dp/data/rows.py: on the device, or memory-mapped for datasets larger than memory);
    each step asks it for the sampled rows only, so the dataset is never copied whole. y may stay on
    the CPU; each batch is moved to `device` (default: the model's device). With `resume_from`, the
    model, optimizer and generator are restored and the run continues from that step, so the
    final parameters are bit-identical to an uninterrupted run on the same hardware.
    """
    hooks = hooks if hooks is not None else TrainingHooks()
    rows = as_rows(X)
    if rows.n_rows != y.shape[0]:
        raise ValueError(f"X has {rows.n_rows} rows but y has {y.shape[0]}")
    n = rows.n_rows if units is None else units.index.n_units
    if n < 1:
        raise ValueError("the dataset has no rows")
    if y.dim() not in (1, 2):  # (n,) labels or values; (n, T) a language model's token targets
        raise ValueError(f"y must have shape (n,) or (n, T), got {tuple(y.shape)}")
    check_supported(model)
    if not trainable_parameters(model):
        raise ValueError("model has no trainable parameters")

    device = torch.device(device) if device is not None else next(model.parameters()).device
    if not isinstance(generator, SecureRandom):
        raise TypeError("privacy-protecting draws must come from a SecureRandom, not a torch.Generator")
    if generator.device.type != device.type:
        raise ValueError(
            f"the generator is on {generator.device} but training runs on {device}; "
            "create it with SecureRandom.from_os_entropy(device, ...)"
        )
    model.to(device)
    model.train()

    params = trainable_parameters(model)
    optimizer = _make_optimizer(list(params.values()), config)

    live = LiveState(model, optimizer, generator)
    step = 0
    if resume_from is not None:
        if not 0 <= resume_from.step <= config.steps:
            raise ValueError(f"cannot resume at step {resume_from.step} of a {config.steps}-step run")
        step = live.restore(resume_from)

    aggregator = (
        aggregator if aggregator is not None else per_sample_map_aggregator(model, AbadiClip(config.clipping_norm))
    )
    noise_std = config.noise_multiplier * aggregator.sensitivity
    expected_batch_size = (  # public: q, n and the hold-out fraction are public
        config.expected_batch_size if config.expected_batch_size is not None else config.sampling_probability * n
    )

    def take_step(step: int) -> None:
        with record_function("privtrain.sample"):
            batch = poisson_sample(n, sampling_probability=config.sampling_probability, generator=generator)
            features, targets = _batch(rows, y, batch, units=units, generator=generator)
        with record_function("privtrain.clipped_sum"):
            grad_sum = aggregator.clipped_sum(
                model,
                features,
                targets,
                step=step,
                loss=config.loss,
                max_physical_batch_size=config.max_physical_batch_size,
                generator=generator,
            )
        with record_function("privtrain.noise_and_update"):
            noisy_grad = privatise_sum(
                grad_sum, noise_std=noise_std, normaliser=expected_batch_size, generator=generator
            )
            del grad_sum
            for name, p in params.items():
                p.grad = noisy_grad[name]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run_steps(live, step=step, steps=config.steps, hooks=hooks, take_step=take_step)
