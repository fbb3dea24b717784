"""Step cost of the KL family relative to a non-private full-batch gradient step, in one run.

For each case (model, n rows) it times, interleaved in the same process with one thread:
- a non-private full-batch step: mean loss over all n rows, backward, SGD update;
- noisy-gd / proximal-point inner step: clipped full pass (the shared engine: ghost clipping where
  exact, else vmap), one Gaussian release, regulariser, projection, weighted average;
- adaptive-noisy-gd iteration: clipped full pass, noisy norm, gradient release, update;
- KL-Spider round start: clipped full pass + release + normalised step;
- KL-Spider difference: per-sample gradients at two points in lockstep over the same chunks,
  difference, clip, sum, release (two passes; ghost clipping cannot give per-example norms of a
  difference, so these are materialised — compare with the reference vmap pass).
Each is the worker's own code (worker/optimizers/kl_*.py primitives) on synthetic data.

    .venv/bin/python -m bench.kl_step_time --repeats 7
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from algorithms.kl_family.accounting import NOISE_SAFETY, units_for
from algorithms.kl_family.common import FullBatch, assign_flat, flat_params
from algorithms.kl_family.noisy_gd import InnerSolver, InnerState, inner_step
from algorithms.kl_family.schedules import adaptive_constants
from dp.per_example.per_sample import AbadiClip, clipped_grad_sum
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model


@dataclass(frozen=True)
class Case:
    label: str
    model: str
    params: dict
    features: int
    classes: int
    n: int


CASES = (
    Case("logistic-regression, 64 features × 10 classes, n=4096", "logistic-regression", {}, 64, 10, 4096),
    Case("mlp [128] tanh, 100 features, 2 classes, n=4096", "mlp", {"hidden_sizes": [128]}, 100, 2, 4096),
)


def _setup(case: Case) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(case.n, case.features, generator=g)
    y = torch.randint(0, case.classes, (case.n,), generator=g)
    model = build_model(
        case.model,
        case.params,
        input_shape=(case.features,),
        n_outputs=case.classes,
        generator=torch.Generator().manual_seed(1),
    )
    return model, X, y


def _batch(X: torch.Tensor, y: torch.Tensor, chunk: int) -> FullBatch:
    return FullBatch(
        X=X,
        y=y,
        loss="cross_entropy",
        lipschitz=1.0,
        normaliser=float(len(X)),
        max_physical_batch_size=chunk,
        generator=SecureRandom.from_seed(2),
        noise_safety=NOISE_SAFETY,
        units_for=units_for,
    )


def steppers(case: Case, chunk: int) -> dict[str, Callable[[], None]]:
    model, X, y = _setup(case)
    d = sum(p.numel() for p in model.parameters())
    data = _batch(X, y, chunk)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    solver = InnerSolver(lipschitz=1.0, weak_convexity=1.0, steps=10**9, noise_std=1e-3)
    inner = InnerState.start(flat_params(model).double())
    constants = adaptive_constants(n=case.n, d=d, rho=1.0, L0=1.0, beta=0.05)
    assert constants is not None

    def non_private() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(X), y).backward()
        optimizer.step()

    def noisy_gd() -> None:
        inner_step(model, data, solver, inner)

    def adaptive() -> None:
        grads = data.clipped_sum(model)
        norm = float(torch.cat([g.reshape(-1) for g in grads.values()]).norm()) / case.n
        noisy = data.noisy_scalar("norm", model, norm, noise_std=constants.norm_noise)
        g = data.release("gradient", model, grads, noise_std=constants.gradient_noise(noisy))
        assign_flat(model, flat_params(model).double() - g / 2.0)

    def spider_start() -> None:
        g = data.noisy_gradient(model, noise_std=1e-3)
        assign_flat(model, flat_params(model).double() - 1e-3 * g / g.norm())

    def spider_difference() -> None:
        w = flat_params(model).double()
        assign_flat(model, w - 1e-3)
        data.release("difference", model, data.clipped_difference_sum(model, w, clip=0.25), noise_std=1e-4)

    def vmap_pass() -> None:
        clipped_grad_sum(
            model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=chunk
        )

    return {
        "non-private full-batch step": non_private,
        "reference: one vmap clipped pass (materialised per-sample gradients)": vmap_pass,
        "noisy-gd / proximal-point inner step": noisy_gd,
        "adaptive-noisy-gd iteration": adaptive,
        "kl-spider round start": spider_start,
        "kl-spider difference (2 passes)": spider_difference,
    }


def measure(case: Case, *, repeats: int, chunk: int) -> dict[str, float]:
    fns = steppers(case, chunk)
    for fn in fns.values():  # warm-up: lazy init, allocator
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=256, help="physical chunk (worker default 256)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, 1 thread, "
        f"chunk {args.chunk}, median of {args.repeats}"
    )
    for case in CASES:
        medians = measure(case, repeats=args.repeats, chunk=args.chunk)
        base = medians["non-private full-batch step"]
        print(f"\n{case.label}\n\n| step | ms | × non-private |\n|---|---|---|")
        for name, value in medians.items():
            print(f"| {name} | {value * 1e3:.1f} | {value / base:.1f} |")


if __name__ == "__main__":
    main()
