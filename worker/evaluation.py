"""Hold-out selection and the DP release of a job's evaluation metric (app/evaluation.py prices it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.evaluation import (
    CONFIDENCE,
    EvaluationPlan,
    gaussian_half_width,
    released_metric,
    snapped_laplace_half_width,
)
from worker.data.rows import Rows, as_rows, iter_row_chunks
from worker.optimizers import discrete_samplers
from worker.optimizers.secure_random import SecureRandom

EVAL_CHUNK_ROWS = 4096


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
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, mask, allow_pickle=False)
    os.replace(tmp, path)
    return mask


def metric_sum(model: nn.Module, X: torch.Tensor | Rows, y: torch.Tensor, plan: EvaluationPlan) -> float:
    """Σ over held-out rows of 1[correct] or min(squared error, R): sensitivity plan.sensitivity."""
    device = next(model.parameters()).device
    model.eval()
    total = 0.0
    with torch.no_grad():
        rows = as_rows(X)
        for index in iter_row_chunks(rows, chunk_rows=EVAL_CHUNK_ROWS):
            xb = rows.take(index).to(device)
            yb = y[index.to(y.device)].to(device)
            out = model(xb)
            if plan.metric == "accuracy":
                total += float((out.argmax(dim=1) == yb).sum().item())
            else:
                errors = (out.squeeze(-1).double() - yb.double()) ** 2
                errors = torch.nan_to_num(errors, nan=plan.sensitivity, posinf=plan.sensitivity)
                total += float(errors.clamp(0.0, plan.sensitivity).sum().item())
    return total


def noisy_sum(plan: EvaluationPlan, raw_sum: float, random: SecureRandom) -> float:
    """The metric's sum with the charged noise: Laplace(b) or N(0, std²), b / std = plan.noise_scale.

    Laplace: snapped to a power-of-two grid with exact discrete Laplace noise, so the released
    double does not reveal the true sum (Mironov 2012) and the mechanism is exactly (Δ/b)-DP.
    Gaussian: the stream's Gaussian (secure mode when on). Both on the CPU stream.
    """
    if random.device.type != "cpu":
        raise ValueError("evaluation noise is drawn from a CPU SecureRandom")
    if plan.mechanism == "laplace":
        released = discrete_samplers.snapped_laplace(
            random.numpy,
            np.array([raw_sum], dtype=np.float64),
            scale=plan.noise_scale,
            l1_sensitivity=plan.sensitivity,
        )
        return float(released[0])
    return raw_sum + float(random.normal((), std=plan.noise_scale, dtype=torch.float64))


@dataclass(frozen=True)
class NoiseTail:
    """What a mechanism's noise on the sum looks like, for the interval beside the metric."""

    distribution: str
    half_width: Callable[[EvaluationPlan, float], float]  # (plan, alpha) -> w, P(|noise| > w) ≤ alpha


def _snapped_laplace_half_width(plan: EvaluationPlan, alpha: float) -> float:
    """From the same public grid and integer scale that :func:`noisy_sum` samples with."""
    parameters = discrete_samplers.snapped_laplace_parameters(
        scale=plan.noise_scale, l1_sensitivity=plan.sensitivity, dimension=1
    )
    return snapped_laplace_half_width(grid=parameters.grid, noise_units=parameters.noise_units, alpha=alpha)


NOISE_TAILS: dict[str, NoiseTail] = {
    "laplace": NoiseTail(
        distribution="snapped Laplace: exact discrete Laplace on a power-of-two grid; noise_scale "
        "is its Laplace scale b on the metric (b on the sum divided by f·n)",
        half_width=_snapped_laplace_half_width,
    ),
    "gaussian": NoiseTail(
        distribution="Gaussian; noise_scale is its standard deviation on the metric (on the sum divided by f·n)",
        half_width=lambda plan, alpha: gaussian_half_width(std=plan.noise_scale, alpha=alpha),
    ),
}


def release(
    model: nn.Module, X: torch.Tensor | Rows, y: torch.Tensor, plan: EvaluationPlan, *, secure_gaussian: bool = True
) -> dict[str, object]:
    """The released metric, clamped to its range, with its noise scale and a 95% interval."""
    raw = metric_sum(model, X, y, plan)
    noisy = noisy_sum(plan, raw, secure_random(secure_gaussian=secure_gaussian))
    tail = NOISE_TAILS[plan.mechanism]
    return released_metric(
        plan,
        noisy_sum=noisy,
        noise_distribution=tail.distribution,
        noise_half_width_on_sum=tail.half_width(plan, (1.0 - CONFIDENCE) / 2.0),
    )
