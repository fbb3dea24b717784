"""Training losses by name, each summed over the rows it is given.

The per-sample engine evaluates a loss on one row at a time, so "sum" and "mean" coincide there;
summing keeps the definition independent of any batch size (docs/privacy-model.md#neighbours: no realised batch
sizes anywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

__all__ = [
    "IGNORED_TARGET",
    "LOSS_REGISTRY",
    "TASK_LOSSES",
    "LossSpec",
    "TokenLoss",
    "get_loss",
    "loss_for_task",
    "mean_over_unit_rows",
    "mean_over_views",
    "prepare_targets",
    "register_loss",
    "register_mean_over_unit_rows",
    "register_mean_over_views",
    "register_task_loss",
]


@dataclass(frozen=True)
class LossSpec:
    """A loss and the target dtype it needs (class indices or real values)."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    integer_targets: bool


LOSS_REGISTRY: dict[str, LossSpec] = {}


def register_loss(
    name: str, *, integer_targets: bool
) -> Callable[[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], LossSpec]:
    """Register `fn(outputs, targets) -> summed loss` under `name`."""

    def decorator(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> LossSpec:
        if name in LOSS_REGISTRY:
            raise ValueError(f"loss {name!r} is already registered")
        spec = LossSpec(name=name, fn=fn, integer_targets=integer_targets)
        LOSS_REGISTRY[name] = spec
        return spec

    return decorator


def get_loss(name: str) -> LossSpec:
    spec = LOSS_REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSS_REGISTRY)}")
    return spec


def prepare_targets(spec: LossSpec, y: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    """Class labels become int64; regression targets take the model's floating dtype."""
    if spec.integer_targets:
        if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
            raise ValueError(f"loss {spec.name!r} needs integer class labels, got {y.dtype}")
        return y.to(torch.int64)
    return y.to(dtype)


@register_loss("cross_entropy", integer_targets=True)
def _cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="sum")


@register_loss("mse", integer_targets=False)
def _mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    predictions = outputs.squeeze(-1)
    if predictions.shape != targets.shape:
        # Broadcasting (batch, k) against (batch,) would silently train the wrong thing.
        raise ValueError(
            f"mse needs one output per row, got outputs {tuple(outputs.shape)} for targets {tuple(targets.shape)}"
        )
    return F.mse_loss(predictions, targets, reduction="sum")


MEAN_OVER_VIEWS_SUFFIX = "/mean-over-views"


def mean_over_views(base: str) -> str:
    """The name of ``base`` averaged over augmented views (see `register_mean_over_views`)."""
    name = base + MEAN_OVER_VIEWS_SUFFIX
    get_loss(name)  # raises for a base without a views form
    return name


def register_mean_over_views(base: str) -> LossSpec:
    """Register ``base`` averaged over views: outputs (b, K, ...) and targets (b,) give
    Σ_i (1/K) Σ_k base(outputs_ik, targets_i).

    Still a sum of per-row terms, so each engine's per-sample gradient of row i is the mean of its
    K views' gradients, and clipping bounds that mean: one row still moves the sum by at most the
    clipping norm, whatever K is (augmentation multiplicity)."""
    spec = get_loss(base)

    def averaged(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if outputs.dim() < 2 or outputs.shape[0] != targets.shape[0]:
            raise ValueError(f"{spec.name} over views needs outputs (b, K, ...) for targets (b,)")
        views = outputs.shape[1]
        return spec.fn(outputs.flatten(0, 1), targets.repeat_interleave(views, dim=0)) / views

    return register_loss(base + MEAN_OVER_VIEWS_SUFFIX, integer_targets=spec.integer_targets)(averaged)


register_mean_over_views("cross_entropy")
register_mean_over_views("mse")


MEAN_OVER_UNIT_ROWS_SUFFIX = "/mean-over-unit-rows"


def mean_over_unit_rows(base: str) -> str:
    """The name of ``base`` averaged over each privacy unit's row slots (see `register_mean_over_unit_rows`)."""
    name = base + MEAN_OVER_UNIT_ROWS_SUFFIX
    get_loss(name)  # raises for a base without a per-unit form
    return name


def register_mean_over_unit_rows(base: str) -> LossSpec:
    """Register ``base`` averaged over a unit's k row slots: outputs (b, k, ...) and targets (b, k)
    give Σ_u (1/k) Σ_j base(outputs_uj, targets_uj).

    A sum of per-unit terms, so each engine's per-sample gradient of unit u is the mean of its k
    rows' gradients, and clipping bounds that mean: one unit moves the sum by at most the clipping
    norm, however many rows it has (user-level privacy)."""
    spec = get_loss(base)

    def averaged(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if outputs.dim() < 2 or targets.dim() < 2 or outputs.shape[:2] != targets.shape[:2]:
            raise ValueError(f"{spec.name} over unit rows needs outputs (b, k, ...) and targets (b, k)")
        slots = outputs.shape[1]
        return spec.fn(outputs.flatten(0, 1), targets.flatten(0, 1)) / slots

    return register_loss(base + MEAN_OVER_UNIT_ROWS_SUFFIX, integer_targets=spec.integer_targets)(averaged)


register_mean_over_unit_rows("cross_entropy")
register_mean_over_unit_rows("mse")


# ----------------------------------------------------------------------------- language models

IGNORED_TARGET = -100
"""A language-model target that counts for nothing: the padding positions of a row."""

TokenLoss = Literal["mean", "sum"]


def _token_losses(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token next-token losses (b, T-1) and which of them count: logits at t predict target t+1."""
    if outputs.dim() != 3 or targets.dim() != 2 or outputs.shape[:2] != targets.shape:
        raise ValueError(
            f"a language-model loss needs logits (b, T, vocab) and targets (b, T), got {tuple(outputs.shape)} "
            f"and {tuple(targets.shape)}"
        )
    logits, following = outputs[:, :-1], targets[:, 1:]
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), following.reshape(-1), ignore_index=IGNORED_TARGET, reduction="none"
    ).reshape(following.shape)
    return losses, following != IGNORED_TARGET


@register_loss("token_cross_entropy_sum", integer_targets=True)
def _token_cross_entropy_sum(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ over rows of the row's summed next-token losses: one row, however long, is one term."""
    losses, _ = _token_losses(outputs, targets)
    return losses.sum()


@register_loss("token_cross_entropy_mean", integer_targets=True)
def _token_cross_entropy_mean(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Σ over rows of the row's mean next-token loss (a row with no target token adds 0)."""
    losses, counted = _token_losses(outputs, targets)
    per_row = losses.sum(dim=1) / counted.sum(dim=1).clamp_min(1).to(losses.dtype)
    return per_row.sum()


register_mean_over_unit_rows("token_cross_entropy_sum")
register_mean_over_unit_rows("token_cross_entropy_mean")


# ----------------------------------------------------------------------------- task -> loss

TaskLoss = Callable[[TokenLoss], str]
TASK_LOSSES: dict[str, TaskLoss] = {}
"""A dataset's task -> the registered loss its jobs train with (given ``training.token_loss``)."""


def register_task_loss(task: str) -> Callable[[TaskLoss], TaskLoss]:
    """Register the loss choice of one task; every trainer asks `loss_for_task`, none decides itself."""

    def decorator(choose: TaskLoss) -> TaskLoss:
        if task in TASK_LOSSES:
            raise ValueError(f"task {task!r} already has a loss")
        TASK_LOSSES[task] = choose
        return choose

    return decorator


def loss_for_task(task: str, *, token_loss: TokenLoss | None = None) -> str:
    """The loss name a job on a dataset of `task` trains with; `token_loss` (default "mean") is
    read by the language-model task only (submission refuses it elsewhere)."""
    choose = TASK_LOSSES.get(task)
    if choose is None:
        raise ValueError(f"no loss for task {task!r}; known tasks: {sorted(TASK_LOSSES)}")
    return choose(token_loss or "mean")


@register_task_loss("classification")
def _classification_loss(token_loss: TokenLoss) -> str:
    return "cross_entropy"


@register_task_loss("regression")
def _regression_loss(token_loss: TokenLoss) -> str:
    return "mse"


@register_task_loss("language-model")
def _language_model_loss(token_loss: TokenLoss) -> str:
    return f"token_cross_entropy_{token_loss}"
