"""Estimation error of the heavy-tailed DP-SCO family against n, ε and s*, beside the
non-private counterpart (the paper's Fig. 1(b)/(c) and Fig. 7 settings;
docs/reproductions.md#heavy-tailed-high-dimensional-dp-sco-hu-ni-xiao-wang--reproductions).

    .venv/bin/python -m bench.ht_figures fw-vs-n        # Alg 1, Fig 1(b): ε = 1, n = 1e4 … 9e4
    .venv/bin/python -m bench.ht_figures fw-vs-eps      # Alg 1, n = 3e4, ε = 0.5 … 10
    .venv/bin/python -m bench.ht_figures linreg-vs-n    # Alg 3, Fig 7(b)
    .venv/bin/python -m bench.ht_figures linreg-vs-sstar  # Alg 3, Fig 7(c): s* = 5, 10, 20
    .venv/bin/python -m bench.ht_figures opt-vs-n       # Alg 5, sparse logistic (Fig 10 setting)

Each writes docs/figures/ht_<name>.png and prints a markdown table (mean ± sd over seeds).
Public constants (τ, γ) come from the generating distribution, computed on a FRESH sample
that is not the training data, never from the training sample. Seeds and grid sizes
are kept small so that each command runs in a few minutes on the 2-core machine.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from bench.ht_data import (
    excess_risk_linear,
    few_spike_l1,
    linear_problem,
    logistic_problem,
    second_moment,
    sparse_l2,
)
from bench.ht_runner import non_private_fw, non_private_iht, run_private

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
Series = dict[str, list[list[float]]]


def fw_tau(d: int, w_star: np.ndarray) -> float:
    """τ ≥ E(∂_jℓ)² at w = 0 for the squared loss (4·E[y²x_j²]), max over j, from a fresh sample."""
    problem = linear_problem(
        np.random.default_rng(10**6), n=200_000, w_star=w_star, features="lognormal", noise="normal"
    )
    return float(np.max(np.mean(4 * problem.y[:, None] ** 2 * problem.X**2, axis=0)))


def _table(title: str, xs: list[float], series: Series, x_name: str) -> str:
    lines = [f"**{title}**", "", "| " + x_name + " | " + " | ".join(series) + " |", "|---|" + "---|" * len(series)]
    for i, x in enumerate(xs):
        cells = [f"{np.mean(v[i]):.4f} ± {np.std(v[i]):.4f}" for v in series.values()]
        lines.append(f"| {x:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(
    name: str, xs: list[float], series: Series, *, x_label: str, y_label: str, title: str, log_x: bool = True
) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label, values in series.items():
        means = [np.mean(v) for v in values]
        sds = [np.std(v) for v in values]
        ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, label=label)
    if log_x:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURES / f"ht_{name}.png", dpi=120)
    plt.close(fig)


def _collect(xs: list[float], seeds: int, runs: dict[str, Callable[[float, int], float]]) -> Series:
    series: Series = {label: [] for label in runs}
    for x in xs:
        for label, run in runs.items():
            series[label].append([run(x, seed) for seed in range(seeds)])
        print(f"  done {x:g}", flush=True)
    return series


# ----------------------------------------------------------------------------- Alg 1


def fw_alpha(d: int) -> float:
    """Smoothness of E(⟨w,x⟩ − y)²: 2·λ_max(E xxᵀ), a property of the generating distribution."""
    return float(2 * np.linalg.eigvalsh(second_moment("lognormal", d))[-1])


def _fw_setting(d: int = 200) -> tuple[np.ndarray, float, float]:
    w_star = few_spike_l1(np.random.default_rng(123), d)
    return w_star, fw_tau(d, w_star), fw_alpha(d)


def _fw_iterations(n: float, eps: float, tau: float, alpha: float, d: int) -> int:
    return math.ceil((n * eps * alpha**2 / (tau * math.log(2 * d * d / 0.05))) ** (1 / 3))


def _fw_runs(
    w_star: np.ndarray,
    tau: float,
    alpha: float,
    *,
    n_of: Callable[[float], int],
    eps_of: Callable[[float], float],
    d: int,
) -> dict[str, Callable[[float, int], float]]:
    def data(x: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        p = linear_problem(np.random.default_rng(seed), n=n_of(x), w_star=w_star, features="lognormal", noise="normal")
        return p.X, p.y

    def private(preset: str) -> Callable[[float, int], float]:
        def run(x: float, seed: int) -> float:
            X, y = data(x, seed)
            n, eps = n_of(x), eps_of(x)
            hyper = {"preset": preset, "tau": tau, "alpha": alpha, "design_epsilon": eps}
            result = run_private(
                "ht-dp-fw", hyper, X, y, task="regression", target_epsilon=eps, delta=n**-1.1, seed=seed
            )
            return excess_risk_linear(result.weights, w_star, "lognormal")

        return run

    def plain(x: float, seed: int) -> float:
        X, y = data(x, seed)
        T = _fw_iterations(n_of(x), eps_of(x), tau, alpha, d)
        return excess_risk_linear(non_private_fw(X, y, iterations=T, loss="squared", seed=seed), w_star, "lognormal")

    return {
        "ht-dp-fw (theory)": private("theory"),
        "ht-dp-fw (paper-experiments)": private("paper-experiments"),
        "non-private FW (same T)": plain,
    }


def fw_vs_n(seeds: int) -> str:
    d = 200
    w_star, tau, alpha = _fw_setting(d)
    xs = [1e4, 3e4, 5e4, 7e4, 9e4]
    at_one = _fw_runs(w_star, tau, alpha, n_of=int, eps_of=lambda _x: 1.0, d=d)
    at_ten = _fw_runs(w_star, tau, alpha, n_of=int, eps_of=lambda _x: 10.0, d=d)
    runs = {
        "ht-dp-fw (theory), ε = 1": at_one["ht-dp-fw (theory)"],
        "ht-dp-fw (theory), ε = 10": at_ten["ht-dp-fw (theory)"],
        "ht-dp-fw (paper-experiments), ε = 1": at_one["ht-dp-fw (paper-experiments)"],
        "non-private FW (T of ε = 1)": at_one["non-private FW (same T)"],
        "zero vector": lambda _x, _seed: excess_risk_linear(np.zeros(d), w_star, "lognormal"),
    }
    series = _collect(xs, seeds, runs)
    title = f"Alg 1, LASSO, lognormal x, d = {d} (τ = {tau:.0f}, α = {alpha:.0f})"
    _plot("fw_vs_n", xs, series, x_label="n", y_label="excess population risk", title=title)
    return _table(title, xs, series, "n")


def fw_vs_eps(seeds: int) -> str:
    d, n = 200, 30_000
    w_star, tau, alpha = _fw_setting(d)
    xs = [0.5, 1.0, 2.0, 5.0, 10.0]
    series = _collect(xs, seeds, _fw_runs(w_star, tau, alpha, n_of=lambda _x: n, eps_of=float, d=d))
    title = f"Alg 1, LASSO, lognormal x, d = {d}, n = {n}"
    _plot("fw_vs_eps", xs, series, x_label="ε", y_label="excess population risk", title=title)
    return _table(title, xs, series, "ε")


# ----------------------------------------------------------------------------- Alg 3


def _linreg_runs(
    *, n_of: Callable[[float], int], eps_of: Callable[[float], float], s_of: Callable[[float], int], d: int = 200
) -> dict[str, Callable[[float, int], float]]:
    gamma = 5.0  # λ_max(E xxᵀ) of N(0, 5 I): a public property of the generating distribution

    def data(x: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        w_star = sparse_l2(np.random.default_rng(1000 + seed), d, s_of(x))
        p = linear_problem(rng, n=n_of(x), w_star=w_star, features="normal", noise="lognormal")
        return p.X, p.y, w_star

    def private(x: float, seed: int) -> float:
        X, y, w_star = data(x, seed)
        n, eps = n_of(x), eps_of(x)
        hyper = {"s_star": s_of(x), "gamma": gamma, "mu": gamma, "design_epsilon": eps}
        result = run_private(
            "ht-sparse-linreg", hyper, X, y, task="regression", target_epsilon=eps, delta=n**-1.1, seed=seed
        )
        return float(np.sum((result.weights - w_star) ** 2))

    def plain(x: float, seed: int) -> float:
        X, y, w_star = data(x, seed)
        T = math.ceil(math.log(n_of(x)))
        w = non_private_iht(X, y, iterations=T, sparsity=2 * s_of(x), step=(2 / 3) / gamma, seed=seed)
        return float(np.sum((w - w_star) ** 2))

    return {"ht-sparse-linreg (theory)": private, "non-private IHT (same T, s)": plain}


def linreg_vs_n(seeds: int) -> str:
    xs = [2e4, 5e4, 1e5, 2e5]
    series: Series = {}
    for eps in (1.0, 10.0):
        runs = _linreg_runs(n_of=int, eps_of=lambda _x, e=eps: e, s_of=lambda _x: 5)
        got = _collect(xs, seeds, {f"ε = {eps:g}": runs["ht-sparse-linreg (theory)"]})
        series.update({f"ht-sparse-linreg, ε = {eps:g}": got[f"ε = {eps:g}"]})
    plain = _linreg_runs(n_of=int, eps_of=lambda _x: 1.0, s_of=lambda _x: 5)["non-private IHT (same T, s)"]
    series.update(_collect(xs, seeds, {"non-private IHT": plain}))
    title = "Alg 3, x ~ N(0, 5I), lognormal noise, d = 200, s* = 5"
    _plot("linreg_vs_n", xs, series, x_label="n", y_label="‖w − w*‖²", title=title)
    return _table(title, xs, series, "n")


def linreg_vs_sstar(seeds: int) -> str:
    xs = [5.0, 10.0, 20.0]
    series = _collect(xs, seeds, _linreg_runs(n_of=lambda _x: 50_000, eps_of=lambda _x: 1.0, s_of=int))
    title = "Alg 3, x ~ N(0, 5I), lognormal noise, d = 200, n = 5·10⁴, ε = 1"
    _plot("linreg_vs_sstar", xs, series, x_label="s*", y_label="‖w − w*‖²", title=title, log_x=False)
    return _table(title, xs, series, "s*")


# ----------------------------------------------------------------------------- Alg 5


def opt_vs_n(seeds: int) -> str:
    d, s_star = 200, 5
    xs = [8e3, 2e4, 5e4, 1e5]

    def problem(x: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w_star = sparse_l2(np.random.default_rng(2000 + seed), d, s_star)
        p = logistic_problem(np.random.default_rng(seed), n=int(x), w_star=w_star, features="normal", noise="logistic")
        return p.X, p.y, w_star

    def cosine(w: np.ndarray, w_star: np.ndarray) -> float:
        """1 − cos∠(w, w*): logistic w* is identified up to scale only."""
        norm = np.linalg.norm(w) * np.linalg.norm(w_star)
        return float(1 - (w @ w_star) / norm) if norm > 0 else 1.0

    def private(eps: float) -> Callable[[float, int], float]:
        def run(x: float, seed: int) -> float:
            X, y, w_star = problem(x, seed)
            hyper = {"s_star": s_star, "gamma": 5.0 / 4, "mu": 5.0 / 4, "tau": 5.0, "design_epsilon": eps}
            result = run_private(
                "ht-sparse-opt",
                hyper,
                X,
                ((y + 1) / 2).astype(np.int64),
                task="classification",
                target_epsilon=eps,
                delta=x**-1.1,
                seed=seed,
            )
            return cosine(result.weights, w_star)

        return run

    series = _collect(xs, seeds, {"ht-sparse-opt, ε = 1": private(1.0), "ht-sparse-opt, ε = 10": private(10.0)})
    title = "Alg 5, ℓ2-reg. logistic, x ~ N(0, 5I), logistic noise, d = 200, s* = 5"
    _plot("opt_vs_n", xs, series, x_label="n", y_label="1 − cos∠(w, w*)", title=title)
    return _table(title, xs, series, "n")


COMMANDS: dict[str, Callable[[int], str]] = {
    "fw-vs-n": fw_vs_n,
    "fw-vs-eps": fw_vs_eps,
    "linreg-vs-n": linreg_vs_n,
    "linreg-vs-sstar": linreg_vs_sstar,
    "opt-vs-n": opt_vs_n,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=sorted(COMMANDS))
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(COMMANDS[args.figure](args.seeds))


if __name__ == "__main__":
    main()
