"""KL family reproduction (docs/reproductions.md, KL-condition family): excess empirical risk against n at fixed ε on
a synthetic PL least-squares problem, for KL-Spider (κ = 2), adaptive noisy GD, the proximal-point
method, the catalogue's noisy GD (Alg 4) and textbook full-batch noisy GD as the baseline.

Every run is the worker's own loop (worker/optimizers/kl_*.py) with the job's σ calibrated by the
API's own planner at the target ε. Only the gradient ARITHMETIC is replaced, by a "fast
path" for least squares: f(w; x, y) = (⟨w, x⟩ + b − y)² with ‖x‖ ≤ 1, |y| ≤ 1, so the per-example
gradient is 2r_i·(x_i, 1) and ‖∇f‖ ≤ 2√2(‖(w, b)‖ + 1). When that data-independent bound is ≤ L0
no clip binds and Σ_i clip(∇f_i) = n·2(S w̃ − b̃) from sufficient statistics (S = X̃ᵀX̃/n); else the
exact clipped sum is computed in closed form over all rows. Spider's differences use the same
rule (per-example difference ≤ 2‖x̃‖²·r_k ≤ 4r_k = C_k when L1 = 4). ``--check`` first runs
n = 2000 through the real per-sample engine and through the fast path on identical seeds and
reports the largest parameter difference (the two must agree).

Public constants (never computed from the data): rows x = z/‖z‖, z ~ N(0, I_5), so E[x̃x̃ᵀ] has
λ_min = 1/d and the PL constant of F is μ ≈ 1/d, giving γ = 1.25·√d/2 (κ = 2; 25% margin for the
sample's λ_min); L1 = 4 (= 2·max‖x̃‖²); L0 = 8 (covers ‖w̃‖ ≤ 1.8 unclipped); F0 = 1 (F(0) ≤ 1).
w_true has norm 1, w0 = 0, so the initial excess is ≈ 0.2.

    .venv/bin/python -m bench.kl_reproduction --check --seeds 3 --n 1e4 1e5 1e6 4e6 1.6e7
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from algorithms.kl_family.accounting import NOISE_SAFETY, units_for
from algorithms.kl_family.common import FullBatch, assign_flat, flat_params
from algorithms.trainers import TrainingRequest, get_trainer
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

D = 5
EPSILON, DELTA = 1.0, 1e-8
GAMMA = 1.25 * math.sqrt(D) / 2
L0, L1, F0 = 8.0, 4.0, 1.0
TEXTBOOK_STEPS = 100

ALGORITHMS: dict[str, tuple[str, dict[str, Any], int]] = {
    # label: (catalogue name, hyperparameters, training.steps = pass cap or steps)
    "KL-Spider (κ=2)": ("kl-spider", {"L0": L0, "L1": L1, "gamma": GAMMA, "kappa": 2.0, "F0": F0}, 100_000),
    "adaptive noisy GD": ("adaptive-noisy-gd", {"L0": L0, "L1": L1}, 100_000),
    "proximal point": (
        "proximal-point",
        {"L0": L0, "L1_tilde": 0.5, "gamma": GAMMA, "kappa": 2.0, "F0": F0, "max_inner_steps": 20},
        100_000,
    ),
    "noisy GD (Alg 4, L̃1=0.5)": ("noisy-gd", {"L0": L0, "L1_tilde": 0.5}, 100),
    f"textbook noisy GD (T={TEXTBOOK_STEPS})": ("noisy-gd", {"L0": L0, "L1_tilde": 0.5}, TEXTBOOK_STEPS),
}


@dataclass
class Problem:
    X: torch.Tensor  # float32, n × d
    y: torch.Tensor
    S: torch.Tensor  # float64, X̃ᵀX̃/n
    b: torch.Tensor  # float64, X̃ᵀy/n
    w_star: torch.Tensor
    best: float

    @property
    def n(self) -> int:
        return self.X.shape[0]

    def excess(self, w: torch.Tensor) -> float:
        delta = w.double() - self.w_star
        return float(delta @ self.S @ delta)


def make_problem(n: int, seed: int) -> Problem:
    g = torch.Generator().manual_seed(seed)
    w_true = torch.ones(D, dtype=torch.float64) / math.sqrt(D)
    X = torch.empty(n, D)
    y = torch.empty(n)
    S = torch.zeros(D + 1, D + 1, dtype=torch.float64)
    b = torch.zeros(D + 1, dtype=torch.float64)
    yy = 0.0
    for start in range(0, n, 1_000_000):
        m = min(n, start + 1_000_000) - start
        z = torch.randn(m, D, generator=g, dtype=torch.float64)
        x = z / z.norm(dim=1, keepdim=True)
        t = (x @ w_true + 0.1 * torch.randn(m, generator=g, dtype=torch.float64)).clamp(-1, 1)
        X[start : start + m], y[start : start + m] = x.float(), t.float()
        xt = torch.cat([x.float().double(), torch.ones(m, 1, dtype=torch.float64)], dim=1)
        tt = t.float().double()
        S += xt.T @ xt
        b += xt.T @ tt
        yy += float(tt @ tt)
    S, b = S / n, b / n
    w_star = torch.linalg.solve(S, b)
    best = yy / n - float(b @ w_star)
    return Problem(X=X, y=y, S=S, b=b, w_star=w_star, best=best)


@dataclass
class LeastSquaresBatch(FullBatch):
    """FullBatch with the least-squares fast path (exact; see the module docstring)."""

    problem: Problem | None = field(default=None)

    def _unclipped(self, w: torch.Tensor) -> bool:
        return 2 * math.sqrt(2) * (float(w.norm()) + 1.0) <= self.lipschitz

    def _per_example(self, w: torch.Tensor) -> torch.Tensor:
        assert self.problem is not None
        X = self.problem.X.double()
        r = X @ w[:D] + w[D] - self.problem.y.double()
        xt = torch.cat([X, torch.ones(len(r), 1, dtype=torch.float64)], dim=1)
        norms = 2 * r.abs() * xt.norm(dim=1)
        scale = torch.where(norms > self.lipschitz, self.lipschitz / norms.clamp_min(1e-300), 1.0)
        return (scale * 2 * r)[:, None] * xt

    def _as_params(self, model: nn.Module, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        weight, bias = model[-1].weight, model[-1].bias  # type: ignore[index]
        return {"1.weight": vector[:D].reshape(1, D).to(weight.dtype), "1.bias": vector[D:].to(bias.dtype)}

    def clipped_sum(self, model: nn.Module) -> dict[str, torch.Tensor]:
        assert self.problem is not None
        self.passes += 1
        w = flat_params(model).double()
        if self._unclipped(w):
            total = self.problem.n * 2 * (self.problem.S @ w - self.problem.b)
        else:
            total = self._per_example(w).sum(dim=0)
        return self._as_params(model, total)

    def clipped_difference_sum(
        self, model: nn.Module, old_point: torch.Tensor, *, clip: float
    ) -> dict[str, torch.Tensor]:
        assert self.problem is not None
        self.passes += 2
        w_new, w_old = flat_params(model).double(), old_point.double()
        bound = 2 * 2 * float((w_new - w_old).norm())  # 2‖x̃‖²‖Δ‖, ‖x̃‖² ≤ 2
        if self._unclipped(w_new) and self._unclipped(w_old) and bound <= clip:
            total = self.problem.n * 2 * (self.problem.S @ (w_new - w_old))
        else:
            diff = self._per_example(w_new) - self._per_example(w_old)
            norms = diff.norm(dim=1)
            scale = torch.where(norms > clip, clip / norms.clamp_min(1e-300), 1.0)
            total = (scale[:, None] * diff).sum(dim=0)
        return self._as_params(model, total)


def _job(name: str, hyper: dict[str, Any], steps: int, n: int) -> Any:
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_bench",
            "model": {"name": "linear-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": EPSILON, "delta": DELTA},
            "training": {"steps": steps},
        }
    )
    dataset = Dataset(n_rows=n, feature_shape=[D], task="regression", n_classes=None)
    return plan_job(spec, dataset, dataset_delta=DELTA, max_steps=10_000_000)


def _textbook_noisy_gd(problem: Problem, job: Any, seed: int, fast: bool) -> torch.Tensor:
    """T steps w ← w − (G(w) + N(0, (σL0/n)² I))/(2L1): the same event as noisy-gd's (T Gaussians)."""
    model = _model()
    data = _batch(problem, job, seed, fast)
    for _ in range(TEXTBOOK_STEPS):
        g = data.noisy_gradient(model, noise_std=job.noise_multiplier * L0 / problem.n)
        assign_flat(model, flat_params(model).double() - g / (2 * L1))
    return flat_params(model)


def _model() -> nn.Module:
    model = build_model(
        "linear-regression", {}, input_shape=(D,), n_outputs=1, generator=torch.Generator().manual_seed(0)
    )
    assign_flat(model, torch.zeros(D + 1))  # public start w0 = 0
    return model


def _batch(problem: Problem, job: Any, seed: int, fast: bool) -> FullBatch:
    common = dict(
        X=problem.X,
        y=problem.y,
        loss="mse",
        lipschitz=L0,
        normaliser=float(problem.n),
        max_physical_batch_size=4096,
        generator=SecureRandom.from_seed(10_000 + seed),
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
    )
    return LeastSquaresBatch(**common, problem=problem) if fast else FullBatch(**common)  # type: ignore[arg-type]


def run_one(label: str, problem: Problem, seed: int, *, fast: bool = True) -> dict[str, Any]:
    return run_entry(label, ALGORITHMS[label], problem, seed, fast=fast)


def run_entry(
    label: str, entry: tuple[str, dict[str, Any], int], problem: Problem, seed: int, *, fast: bool
) -> dict[str, Any]:
    name, hyper, steps = entry
    job = _job(name, hyper, steps, problem.n)
    start = time.perf_counter()
    if label.startswith("textbook"):
        w, units = _textbook_noisy_gd(problem, job, seed, fast), TEXTBOOK_STEPS
    else:
        model = _model()
        request = TrainingRequest(
            model=model,
            X=problem.X,
            y=problem.y,
            task="regression",
            hyperparameters=job.hyperparameters,
            training=job.training,
            noise_multiplier=job.noise_multiplier,
            sampling_probability=1.0,
            expected_batch_size=float(problem.n),
            steps=job.plan.steps,
            max_physical_batch_size=4096,
            generator=SecureRandom.from_seed(10_000 + seed),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
        )
        import algorithms.kl_family.trainer as trainers

        # The registered trainer unchanged, except that its FullBatch is the fast-path one.
        original = trainers.full_batch
        if fast:
            trainers.full_batch = lambda req, lip, observer=None: _batch(problem, job, seed, True)  # type: ignore[assignment]
        try:
            result = get_trainer(name)(request)
        finally:
            trainers.full_batch = original
        w, units = flat_params(model), result.steps_run
    return {
        "algorithm": label,
        "n": problem.n,
        "seed": seed,
        "excess": problem.excess(w),
        "steps_run": units,
        "steps_planned": job.plan.steps,
        "sigma": job.noise_multiplier,
        "seconds": time.perf_counter() - start,
    }


def check_fast_path(seeds: int = 1) -> float:
    """Real per-sample engine vs fast path on identical seeds (n = 2000): the largest relative
    difference of the final excess. Proximal point is skipped (thousands of passes; it uses the
    same primitives as noisy GD)."""
    worst = 0.0
    for seed in range(seeds):
        problem = make_problem(2000, seed)
        for label, (name, hyper, steps) in ALGORITHMS.items():
            if name == "proximal-point":
                continue
            entry = (name, hyper, min(steps, 300))
            if label.startswith("textbook"):
                a, b = (_textbook_noisy_gd(problem, _job(*entry, problem.n), seed, fast) for fast in (True, False))
                pair = (problem.excess(a), problem.excess(b))
            else:
                pair = tuple(run_entry(label, entry, problem, seed, fast=fast)["excess"] for fast in (True, False))
            worst = max(worst, abs(pair[0] - pair[1]) / max(pair[0], 1e-12))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=float, nargs="+", default=[1e4, 1e5, 1e6, 4e6, 1.6e7])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--json", default="docs/figures/kl_reproduction.json")
    parser.add_argument("--png", default="docs/figures/kl_excess_vs_n.png")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.check:
        print(f"fast path vs per-sample engine, n=2000: max relative excess difference {check_fast_path():.2e}")
    rows = []
    for n in (int(v) for v in args.n):
        for seed in range(args.seeds):
            problem = make_problem(n, seed)
            for label in ALGORITHMS:
                row = run_one(label, problem, seed)
                rows.append(row)
                print(json.dumps(row, ensure_ascii=False), flush=True)
    with open(args.json, "w") as handle:
        json.dump({"epsilon": EPSILON, "delta": DELTA, "d": D, "rows": rows}, handle, indent=1, ensure_ascii=False)
    _plot(rows, args.png)
    _table(rows)


def _medians(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for label in ALGORITHMS:
        by_n: dict[int, list[float]] = {}
        for r in rows:
            if r["algorithm"] == label:
                by_n.setdefault(r["n"], []).append(r["excess"])
        out[label] = {n: float(np.median(v)) for n, v in sorted(by_n.items())}
    return out


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, by_n in _medians(rows).items():
        ns = list(by_n)
        ax.loglog(ns, [by_n[n] for n in ns], marker="o", label=label)
    ax.set_xlabel("n (rows)")
    ax.set_ylabel("excess empirical risk (median over seeds)")
    ax.set_title(f"PL least squares, d={D}, ε={EPSILON}, δ={DELTA:g} (add/remove, clipped)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _table(rows: list[dict[str, Any]]) -> None:
    medians = _medians(rows)
    ns = sorted({r["n"] for r in rows})
    print("| algorithm | " + " | ".join(f"n = {n:.3g}" for n in ns) + " | slope (last two n) |")
    print("|---|" + "---|" * (len(ns) + 1))
    for label, by_n in medians.items():
        values = [by_n.get(n, float("nan")) for n in ns]
        slope = np.polyfit(np.log(ns[-2:]), np.log(values[-2:]), 1)[0] if len(ns) >= 2 else float("nan")
        print(f"| {label} | " + " | ".join(f"{v:.3g}" for v in values) + f" | {slope:.2f} |")


if __name__ == "__main__":
    main()
