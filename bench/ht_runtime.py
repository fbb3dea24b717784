"""Wall time of one heavy-tailed DP-SCO job (the worker's trainer call) against n and d.

    .venv/bin/python -m bench.ht_runtime            # → docs/figures/ht_runtime.png + a markdown table

Alg 1, 3 and 5 are single pass over disjoint blocks, so their time should grow linearly in n·d
(O(nd + T·s·d)); Alg 2 reads all rows every iteration (O(T·nd)). One CPU thread,
lognormal features (n ≤ 1.6·10⁵ at d = 200, d ≤ 800 at n = 2·10⁴), best of 3 runs, so that
the whole run stays within a few minutes. The machine is shared: single timings are noisy.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from bench.ht_data import few_spike_l1, linear_problem
from bench.ht_figures import FIGURES
from bench.ht_runner import run_private

ALGORITHMS = {
    "ht-dp-fw": {},
    "ht-private-lasso": {},
    "ht-sparse-linreg": {"s_star": 5},
    "ht-sparse-opt": {"s_star": 5},
}


def time_job(name: str, n: int, d: int, repeats: int) -> tuple[float, int]:
    rng = np.random.default_rng(0)
    p = linear_problem(rng, n=n, w_star=few_spike_l1(rng, d), features="lognormal", noise="normal")
    runs = [
        run_private(name, ALGORITHMS[name], p.X, p.y, task="regression", target_epsilon=1.0, delta=n**-1.1, seed=seed)
        for seed in range(repeats)
    ]
    return min(r.seconds for r in runs), runs[0].steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    grid = [(n, 200) for n in (10_000, 20_000, 40_000, 80_000, 160_000)] + [(20_000, d) for d in (50, 100, 400, 800)]
    rows = []
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name in ALGORITHMS:
        points = []
        for n, d in grid:
            seconds, steps = time_job(name, n, d, args.repeats)
            rows.append(f"| {name} | {n} | {d} | {steps} | {seconds:.3f} | {seconds / (n * d) * 1e9:.1f} |")
            points.append((n * d, seconds))
            print(rows[-1], flush=True)
        work, seconds = (np.array(v) for v in zip(*points, strict=True))
        slope, intercept = np.polyfit(np.log(work), np.log(seconds), 1)
        line = ax.loglog(work, seconds, "o", label=f"{name} (fitted log-log slope {slope:.2f})")[0]
        span = np.array([work.min(), work.max()])
        ax.loglog(span, np.exp(intercept) * span**slope, "-", color=line.get_color(), alpha=0.6)
    ax.set_xlabel("n·d")
    ax.set_ylabel("seconds per job (1 thread)")
    ax.set_title("heavy-tailed DP-SCO: job time against n·d", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURES / "ht_runtime.png", dpi=120)
    print("\n| algorithm | n | d | T | seconds | ns per n·d |\n|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
