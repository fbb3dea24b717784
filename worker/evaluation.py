"""Hold-out selection and the DP release of a job's evaluation metric (kernel/jobs/evaluation.py prices it)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dp.data.rows import Rows, as_rows, iter_row_chunks
from dp.losses import IGNORED_TARGET
from dp.randomness import discrete_samplers
from dp.randomness.secure_random import SecureRandom
from kernel.jobs.evaluation import (
    CONFIDENCE,
    EvaluationPlan,
    gaussian_half_width,
    released_metric,
)
from privtrain_common.atomic_files import write_atomically

EVAL_CHUNK_ROWS = 4096
EVAL_CHUNK_TOKENS = 2048
"""Language-model evaluation: tokens a chunk, so a chunk's logits stay about 2048·vocab floats."""


def secure_random(*, secure_gaussian: bool = True) -> SecureRandom:
    """A fresh OS-seeded CPU SecureRandom (NumPy Philox, 256-bit seed; docs/privacy-model.md §5).

    Hold-out coins and the evaluation noise are drawn on its NumPy stream; each use gets its own.
    """
    return SecureRandom.from_os_entropy("cpu", secure_gaussian=secure_gaussian)


def holdout_mask(n_rows: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Independent per-row coins, so adding a row changes one side of the split only.

    ``rng`` is a SecureRandom's ``numpy`` stream (fixed seeds in tests only)."""
    return rng.random(n_rows) < fraction


def load_or_draw_holdout(path: Path, n_rows: int, fraction: float) -> np.ndarray:
    """The split must survive retries: a resumed attempt trains on exactly the same rows.

    The mask is secret (it says which rows were trained on); it stays on worker storage.
    """
    if path.exists():
        mask: np.ndarray = np.load(path, allow_pickle=False)
        if mask.shape == (n_rows,) and mask.dtype == np.bool_:
            return mask
    mask = holdout_mask(n_rows, fraction, secure_random().numpy)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.save(buffer, mask, allow_pickle=False)
    write_atomically(path, buffer.getvalue())
    return mask


RowTerms = Callable[[torch.Tensor, torch.Tensor, EvaluationPlan], torch.Tensor]
ROW_TERMS: dict[str, RowTerms] = {}
"""A metric -> each held-out row's term over one chunk (float64, (b,)), each in [0, plan.sensitivity]."""


def register_row_terms(metric: str) -> Callable[[RowTerms], RowTerms]:
    def decorator(row_terms: RowTerms) -> RowTerms:
        if metric in ROW_TERMS:
            raise ValueError(f"metric {metric!r} already has row terms")
        ROW_TERMS[metric] = row_terms
        return row_terms

    return decorator


@register_row_terms("accuracy")
def _correct(outputs: torch.Tensor, targets: torch.Tensor, plan: EvaluationPlan) -> torch.Tensor:
    return (outputs.argmax(dim=1) == targets).double()


@register_row_terms("mse")
def _clipped_squared_errors(outputs: torch.Tensor, targets: torch.Tensor, plan: EvaluationPlan) -> torch.Tensor:
    errors = (outputs.squeeze(-1).double() - targets.double()) ** 2
    errors = torch.nan_to_num(errors, nan=plan.sensitivity, posinf=plan.sensitivity)
    return errors.clamp(0.0, plan.sensitivity)


def mean_token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row's mean next-token cross-entropy (float64, (b,)) over its non-ignored targets.

    Logits at position t predict target t + 1, as in training. A row with no target token
    (padding only, or one token) gets 0: it has no loss to average, and 0 keeps its term inside
    [0, R] like every other row's."""
    if logits.dim() != 3 or targets.dim() != 2 or logits.shape[:2] != targets.shape:
        raise ValueError(
            f"perplexity needs logits (b, T, vocab) and targets (b, T), got {tuple(logits.shape)} "
            f"and {tuple(targets.shape)}"
        )
    following = targets[:, 1:]
    losses = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        following.reshape(-1),
        ignore_index=IGNORED_TARGET,
        reduction="none",
    ).reshape(following.shape)
    counted = following != IGNORED_TARGET
    # float64 sums, like the other metrics; ignored positions are exactly 0 even where logits are not finite
    losses = torch.where(counted, losses.double(), 0.0)
    return losses.sum(dim=1) / counted.sum(dim=1).clamp_min(1).to(losses.dtype)


@register_row_terms("perplexity")
def _clipped_token_losses(outputs: torch.Tensor, targets: torch.Tensor, plan: EvaluationPlan) -> torch.Tensor:
    losses = torch.nan_to_num(mean_token_losses(outputs, targets), nan=plan.sensitivity, posinf=plan.sensitivity)
    return losses.clamp(0.0, plan.sensitivity)


def _chunk_rows(rows: Rows, plan: EvaluationPlan) -> int:
    """Language models: about EVAL_CHUNK_TOKENS tokens a chunk, since their logits are (b, T, vocab)."""
    if plan.metric != "perplexity" or not rows.row_shape:
        return EVAL_CHUNK_ROWS
    return max(1, min(EVAL_CHUNK_ROWS, EVAL_CHUNK_TOKENS // max(1, rows.row_shape[0])))


def metric_sum(
    model: nn.Module,
    X: torch.Tensor | Rows,
    y: torch.Tensor,
    plan: EvaluationPlan,
    *,
    row_weights: torch.Tensor | None = None,
) -> float:
    """Σ over held-out rows of 1[correct], min(squared error, R) or min(mean token loss, R):
    sensitivity plan.sensitivity. With ``row_weights`` (a privacy unit dataset: 1/m for each of a
    unit's m held-out rows) each row's term is weighted, so one unit's terms add up to at most R:
    the unit's mean. The model runs in eval mode without gradients."""
    device = next(model.parameters()).device
    row_terms = ROW_TERMS[plan.metric]
    model.eval()
    total = 0.0
    with torch.no_grad():
        rows = as_rows(X)
        for index in iter_row_chunks(rows, chunk_rows=_chunk_rows(rows, plan)):
            xb = rows.take(index).to(device)
            yb = y[index.to(y.device)].to(device)
            terms = row_terms(model(xb), yb, plan)
            if row_weights is not None:
                terms = terms * row_weights[index.to(row_weights.device)].to(terms.device, torch.float64)
            total += float(terms.sum().item())
    return total


def noisy_sum(plan: EvaluationPlan, raw_sum: float, random: SecureRandom) -> float:
    """The metric's sum with the charged noise: Laplace(b) or N(0, std²), b / std = plan.noise_scale.

    Laplace: snapped to a power-of-two grid with exact discrete Laplace noise, so the released
    double does not reveal the true sum (Mironov 2012) and the mechanism is exactly (Δ/b)-DP.
    Gaussian: the stream's Gaussian (secure mode when on). Both on the CPU stream.
    """
    return _noisy_sum(plan, raw_sum, random, scale=plan.noise_scale)


def _noisy_sum(plan: EvaluationPlan, raw_sum: float, random: SecureRandom, *, scale: float) -> float:
    if random.device.type != "cpu":
        raise ValueError("evaluation noise is drawn from a CPU SecureRandom")
    if plan.mechanism == "laplace":
        released = discrete_samplers.snapped_laplace(
            random.numpy,
            np.array([raw_sum], dtype=np.float64),
            scale=scale,
            l1_sensitivity=plan.sensitivity,
        )
        return float(released[0])
    return raw_sum + float(random.normal((), std=scale, dtype=torch.float64))


@dataclass(frozen=True)
class NoiseTail:
    """What a mechanism's noise on the sum looks like, for the interval beside the metric."""

    distribution: str
    half_width: Callable[[EvaluationPlan, float, float], float]
    """(plan, its noise scale, alpha) -> w with P(|noise| > w) ≤ alpha."""


def _snapped_laplace_half_width(plan: EvaluationPlan, scale: float, alpha: float) -> float:
    """From the same public grid and integer scale that :func:`noisy_sum` samples with."""
    parameters = discrete_samplers.snapped_laplace_parameters(scale=scale, l1_sensitivity=plan.sensitivity, dimension=1)
    return discrete_samplers.snapped_laplace_half_width(
        grid=parameters.grid, noise_units=parameters.noise_units, alpha=alpha
    )


NOISE_TAILS: dict[str, NoiseTail] = {
    "laplace": NoiseTail(
        distribution="snapped Laplace: exact discrete Laplace on a power-of-two grid; noise_scale "
        "is its Laplace scale b on the metric (b on the sum divided by f·n)",
        half_width=_snapped_laplace_half_width,
    ),
    "gaussian": NoiseTail(
        distribution="Gaussian; noise_scale is its standard deviation on the metric (on the sum divided by f·n)",
        half_width=lambda plan, scale, alpha: gaussian_half_width(std=scale, alpha=alpha),
    ),
}


def release(
    model: nn.Module,
    X: torch.Tensor | Rows,
    y: torch.Tensor,
    plan: EvaluationPlan,
    *,
    secure_gaussian: bool = True,
    row_weights: torch.Tensor | None = None,
) -> dict[str, object]:
    """The released metric, clamped to its range, with its noise scale and a 95% interval
    (``row_weights``: see :func:`metric_sum`)."""
    raw = metric_sum(model, X, y, plan, row_weights=row_weights)
    scale = plan.noise_scale
    noisy = _noisy_sum(plan, raw, secure_random(secure_gaussian=secure_gaussian), scale=scale)
    tail = NOISE_TAILS[plan.mechanism]
    return released_metric(
        plan,
        noisy_sum=noisy,
        noise_distribution=tail.distribution,
        noise_half_width_on_sum=tail.half_width(plan, scale, (1.0 - CONFIDENCE) / 2.0),
    )
