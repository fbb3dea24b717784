"""Augmentation multiplicity (De et al. 2022, ``training.augmult: K``): the DP per-sample-map family and sgd/adam.

Each sampled image is seen as K augmented views (dp/data/augment.py) and its per-sample
gradient is the MEAN of the K views' gradients, g_i = (1/K) Σ_k ∇ℓ(x_ik), which is what gets
clipped. One row still contributes one clipped vector to the released sum, so the sum's
sensitivity — and the privacy charge — is the same for every K; only the compute grows (K
forwards and backwards per row).

Exact with both per-sample engines, without touching them: `AugmentedViews` wraps the model so
that one row is the (K, C, H, W) stack of its views and the model is called once per view on the
whole batch (every layer then sees the batch on dimension 0, K times, which the ghost engine's
rules treat as a reused layer: their calls add up per row), and the loss is the registered
mean-over-views form of the job's loss (dp/losses.py). `AugmultAggregator` builds
the views of the sampled batch and hands the wrapped model, whose parameters keep their names, to
the job's own aggregator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from dp.data.augment import augmented_views, default_padding, draw_views
from dp.losses import mean_over_views
from dp.per_example.aggregator import BatchAggregator, BatchContext, TensorDict
from dp.per_example.ghost import ghost_container
from dp.per_example.per_sample import supported_module
from dp.randomness.secure_random import SecureRandom

__all__ = ["AugmentedViews", "AugmultAggregator", "forward_views", "stacked_sum", "with_augmult"]


@ghost_container
@supported_module
class AugmentedViews(nn.Module):
    """(b, K, ...) -> (b, K, outputs): the wrapped model applied to each slice k of every row.

    Shares the wrapped model's children, under their own names, instead of holding the model as a
    child: its parameters keep their names (``0.weight``, not ``inner.0.weight``), so whatever an
    aggregator keys by parameter name (DC-DPSGD's projection scope, DiceSGD's error feedback)
    sees the same names through the wrapper as without it. Owns no parameters and only calls the
    wrapped model, once per slice on all b rows, so both engines accept it wherever they accept
    the wrapped model. The wrapped model's root must own no parameters or buffers (every model of
    the zoo is a container); they could not be shared by name."""

    _stacked_model: nn.Module

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        if inner._parameters or inner._buffers:
            raise ValueError(
                f"{type(inner).__name__} owns parameters or buffers at its root: it cannot be seen per "
                "stacked row (wrap them in a child module)"
            )
        object.__setattr__(self, "_modules", inner._modules)  # the same dict: children, names and all
        object.__setattr__(self, "_stacked_model", inner)  # not a child: it would prefix the names

    def forward(self, views: torch.Tensor) -> torch.Tensor:
        model = self._stacked_model
        return torch.stack([model(views[:, k]) for k in range(views.shape[1])], dim=1)


def stacked_sum(
    inner: BatchAggregator, model: nn.Module, stacked: torch.Tensor, y: torch.Tensor, context: BatchContext
) -> TensorDict:
    """``inner``'s sum with each row a (b, K, ...) stack (K views of an image, or K rows of a
    privacy unit) seen through `AugmentedViews`, ``context.loss`` a mean over the K; keyed by
    ``model``'s own parameter names. K rows per row: fewer rows per chunk keep the memory bound
    (the result is unchanged)."""
    chunk = max(1, context.max_physical_batch_size // stacked.shape[1])
    return inner.sum_batch(AugmentedViews(model), stacked, y, replace(context, max_physical_batch_size=chunk))


@dataclass(frozen=True)
class AugmultAggregator(BatchAggregator):
    """The job's aggregator on K augmented views of each sampled image, gradients averaged per row.

    Same sensitivity as the wrapped aggregator: the per-sample map is applied to each row's mean
    gradient, so every row still contributes at most the map's bound."""

    inner: BatchAggregator
    views: int
    padding: int | None = None
    """Zero padding per side before the random crop; None: `default_padding` of the images."""

    def __post_init__(self) -> None:
        if isinstance(self.views, bool) or not isinstance(self.views, int) or self.views < 1:
            raise ValueError(f"views must be an integer >= 1, got {self.views!r}")

    @property
    def sensitivity(self) -> float:
        return self.inner.sensitivity

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        views = views_of(X, views=self.views, generator=context.generator, step=context.step, padding=self.padding)
        return stacked_sum(self.inner, model, views, y, replace(context, loss=mean_over_views(context.loss)))


def views_of(
    X: torch.Tensor, *, views: int, generator: SecureRandom, step: int, padding: int | None = None
) -> torch.Tensor:
    """(b, C, H, W) images -> their (b, K, C, H, W) augmented views at ``step``; ``padding`` None:
    `default_padding` of the images."""
    if X.dim() != 4:
        raise ValueError("augmentation multiplicity needs image rows of shape (C, H, W)")
    pad = padding if padding is not None else default_padding(X.shape[2], X.shape[3])
    draws = draw_views(images=X.shape[0], views=views, padding=pad, generator=generator, step=step, device=X.device)
    return augmented_views(X, draws, padding=pad)


def with_augmult(aggregator: BatchAggregator, views: int | None) -> BatchAggregator:
    """``aggregator`` on ``views`` augmented views per image; unchanged when views is None or 1."""
    if views is None or views == 1:
        return aggregator
    return AugmultAggregator(aggregator, views)


def forward_views(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    views: int | None,
    generator: SecureRandom,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs and their targets for a non-private step: the model on X, or with ``views`` = K > 1
    on K augmented views of each image, the K outputs of row i all paired with y_i (a mean loss over
    them is the mean over rows of each row's mean over its views)."""
    if views is None or views == 1:
        return model(X), y
    outputs = AugmentedViews(model)(views_of(X, views=views, generator=generator, step=step))
    return outputs.flatten(0, 1), y.repeat_interleave(views, dim=0)
