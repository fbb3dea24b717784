"""Hold-out selection and the DP release of a job's evaluation metric (app/evaluation.py prices it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.evaluation import EvaluationPlan
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
        mask = np.load(path, allow_pickle=False)
        if mask.shape == (n_rows,) and mask.dtype == np.bool_:
            return mask
    mask = holdout_mask(n_rows, fraction, secure_random().numpy)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, mask, allow_pickle=False)
    os.replace(tmp, path)
    return mask


def metric_sum(model: nn.Module, X: torch.Tensor, y: torch.Tensor, plan: EvaluationPlan) -> float:
    """Σ over held-out rows of 1[correct] or min(squared error, R): sensitivity plan.sensitivity."""
    device = next(model.parameters()).device
    model.eval()
    total = 0.0
    with torch.no_grad():
        for start in range(0, X.shape[0], EVAL_CHUNK_ROWS):
            xb = X[start : start + EVAL_CHUNK_ROWS].to(device)
            yb = y[start : start + EVAL_CHUNK_ROWS].to(device)
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
            random.numpy, np.array([raw_sum], dtype=np.float64), scale=plan.noise_scale,
            l1_sensitivity=plan.sensitivity,
        )
        return float(released[0])
    return raw_sum + float(random.normal((), std=plan.noise_scale, dtype=torch.float64))


def release(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, plan: EvaluationPlan, *, secure_gaussian: bool = True
) -> dict[str, object]:
    raw = metric_sum(model, X, y, plan)
    value = plan.normalise(noisy_sum=noisy_sum(plan, raw, secure_random(secure_gaussian=secure_gaussian)))
    return {plan.metric: value, **plan.describe()}
