"""Hold-out selection and the DP release of a job's evaluation metric (app/evaluation.py prices it)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from app.evaluation import EvaluationPlan

EVAL_CHUNK_ROWS = 4096


def secure_rng() -> np.random.Generator:
    """A numpy generator seeded with 128 bits from the OS CSPRNG (privacy.md §2)."""
    return np.random.default_rng(int.from_bytes(os.urandom(16), "little"))


def holdout_mask(n_rows: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Independent per-row coins, so adding a row changes one side of the split only."""
    return rng.random(n_rows) < fraction


def load_or_draw_holdout(path: Path, n_rows: int, fraction: float) -> np.ndarray:
    """The split must survive retries: a resumed attempt trains on exactly the same rows.

    The mask is secret (it says which rows were trained on); it stays on worker storage.
    """
    if path.exists():
        mask = np.load(path, allow_pickle=False)
        if mask.shape == (n_rows,) and mask.dtype == np.bool_:
            return mask
    mask = holdout_mask(n_rows, fraction, secure_rng())
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


def draw_noise(plan: EvaluationPlan, rng: np.random.Generator) -> float:
    """One draw of the charged noise: Laplace(b) or N(0, std²), with b / std = plan.noise_scale."""
    if plan.mechanism == "laplace":
        return float(rng.laplace(0.0, plan.noise_scale))
    return float(rng.normal(0.0, plan.noise_scale))


def release(model: nn.Module, X: torch.Tensor, y: torch.Tensor, plan: EvaluationPlan) -> dict[str, object]:
    raw = metric_sum(model, X, y, plan)
    value = plan.release(raw_sum=raw, noise=draw_noise(plan, secure_rng()))
    return {plan.metric: value, **plan.describe()}
