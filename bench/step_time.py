"""Step time and peak memory of each DP algorithm relative to a non-private step, in one run.

For every (model, batch) case it times, in the same process and interleaved:
- a non-private SGD step on a Poisson batch of the same expected size;
- each requested algorithm through its registered worker trainer (the code a job runs), with the
  job's plan built by the API's own planner;
- DP-SGD through Opacus's own PrivacyEngine (hooks mode, Poisson sampling) as the outside reference.
Peak memory is measured in a fresh subprocess that runs only that stepper, after one warm-up
step (lazy imports, thread pools and allocator caches are not a step's memory): on a CPU, the peak
resident set during the steps (the kernel's VmHWM, reset after setup through /proc/self/clear_refs)
minus the resident set before the first step; on a GPU, torch.cuda.max_memory_allocated above the
memory allocated before the first step.

    .venv/bin/python -m bench.step_time --algorithms dp-sgd --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

N_ROWS = 4096


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    params: dict
    input_shape: tuple[int, ...]
    n_classes: int
    batch_size: int


CASES = {
    "cnn-b128": Case("cnn2-gn 1×28×28, B=128", "cnn2-gn", {}, (1, 28, 28), 10, 128),
    "cnn-b512": Case("cnn2-gn 1×28×28, B=512", "cnn2-gn", {}, (1, 28, 28), 10, 512),
    "mlp-b256": Case("mlp [256, 256] on 100 features, B=256", "mlp", {"hidden_sizes": [256, 256]}, (100,), 2, 256),
}


def _data(case: Case, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    X = torch.randn((N_ROWS, *case.input_shape), generator=g)
    y = torch.randint(0, case.n_classes, (N_ROWS,), generator=g)
    return X.to(device), y.to(device)


def _model(case: Case, device: torch.device) -> nn.Module:
    return build_model(
        case.model,
        case.params,
        input_shape=case.input_shape,
        n_outputs=case.n_classes,
        generator=torch.Generator().manual_seed(0),
    ).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def nonprivate_stepper(case: Case, device: torch.device) -> Callable[[int], None]:
    model, (X, y) = _model(case, device), _data(case, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    q = case.batch_size / N_ROWS
    g = torch.Generator(device=device).manual_seed(1)

    def run(steps: int) -> None:
        for _ in range(steps):
            batch = torch.rand(N_ROWS, generator=g, device=device) < q
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(X[batch]), y[batch]).backward()
            optimizer.step()
        _sync(device)

    return run


def opacus_stepper(case: Case, device: torch.device) -> Callable[[int], None]:
    model, (X, y) = _model(case, device), _data(case, device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, y), batch_size=case.batch_size)
    return opacus_run(model, loader, loss=nn.functional.cross_entropy, device=device)


def opacus_run(
    model: nn.Module,
    loader: torch.utils.data.DataLoader[tuple[torch.Tensor, ...]],
    *,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
    free_per_sample_grads: bool = False,
) -> Callable[[int], None]:
    """Steps of Opacus's PrivacyEngine on ``model`` (hooks mode, Poisson sampling, σ = 1, C = 1),
    the outside reference; ``loss`` is the batch's mean loss. ``free_per_sample_grads``: drop them
    after the last step, so what a step stores is counted in its peak, not in the memory before it."""
    import warnings

    from opacus import PrivacyEngine

    warnings.filterwarnings("ignore")
    engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
        data_loader=loader,
        noise_multiplier=1.0,
        max_grad_norm=1.0,
        poisson_sampling=True,
        grad_sample_mode="hooks",
    )

    def run(steps: int) -> None:
        done = 0
        while done < steps:
            for xb, yb in loader:
                optimizer.zero_grad(set_to_none=True)
                loss(model(xb), yb).backward()
                optimizer.step()
                done += 1
                if done == steps:
                    break
        if free_per_sample_grads:
            optimizer.zero_grad(set_to_none=True)
        _sync(device)

    return run


def algorithm_stepper(name: str) -> Callable[[Case, torch.device], Callable[[int], None]]:
    def make(case: Case, device: torch.device) -> Callable[[int], None]:
        dataset = Dataset(
            n_rows=N_ROWS, feature_shape=list(case.input_shape), task="classification", n_classes=case.n_classes
        )
        spec = JobCreate.model_validate(
            {
                "dataset_id": "bench",
                "model": {"name": case.model, "params": case.params},
                "algorithm": {"name": name},
                "privacy": {"noise_multiplier": 1.0},
                "training": {"steps": 1, "batch_size": case.batch_size, "learning_rate": 0.01},
            }
        )
        plan = plan_job(spec, dataset, dataset_delta=1e-6, max_steps=10**9)
        model, (X, y) = _model(case, device), _data(case, device)
        trainer = get_trainer(name)
        generator = SecureRandom.from_seed(2, device)

        def run(steps: int) -> None:
            trainer(
                TrainingRequest(
                    model=model,
                    features=TensorRows(X),
                    y=y,
                    task="classification",
                    hyperparameters=plan.hyperparameters,
                    training=plan.training,
                    noise_multiplier=plan.noise_multiplier,
                    sampling_probability=plan.plan.sampling_probability,
                    expected_batch_size=plan.plan.expected_batch_size,
                    steps=steps,
                    max_physical_batch_size=case.batch_size,
                    generator=generator,
                    hooks=TrainingHooks(),
                    resume_from=None,
                    device=device,
                )
            )
            _sync(device)

        return run

    return make


def steppers(algorithms: list[str]) -> dict[str, Callable[[Case, torch.device], Callable[[int], None]]]:
    table: dict[str, Callable[[Case, torch.device], Callable[[int], None]]] = {"non-private": nonprivate_stepper}
    for name in algorithms:
        table[name] = algorithm_stepper(name)
    table["opacus dp-sgd (hooks)"] = opacus_stepper
    return table


def time_per_step(run: Callable[[int], None], *, steps: int, repeats: int) -> float:
    run(3)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(steps)
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)


def peak_memory_child(case_key: str, stepper: str, algorithms: list[str], device: str, steps: int) -> None:
    """Run one stepper in this (fresh) process and print its peak memory above the start."""
    dev = torch.device(device)
    run = steppers(algorithms)[stepper](CASES[case_key], dev)
    print(json.dumps({"peak_bytes": peak_bytes_of_steps(run, device=dev, steps=steps)}))


def peak_bytes_of_steps(run: Callable[[int], None], *, device: torch.device, steps: int) -> int:
    """Peak memory of ``run(steps)`` above what was held before it, after one warm-up step (lazy
    imports, thread pools and allocator caches are not a step's memory). Run it in a fresh process:
    the CPU figure is the process's peak resident set."""
    run(1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run(steps)
        return int(torch.cuda.max_memory_allocated() - base)
    base = reset_peak_resident_set()
    run(steps)
    return resident_set_kib("VmHWM") * 1024 - base


def resident_set_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in KiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_resident_set() -> int:
    """Reset the kernel's peak-RSS mark (``echo 5 > /proc/self/clear_refs``, Linux ≥ 4.0) so the
    peak measured next belongs to the steps, not to imports and setup; returns the current RSS
    in bytes, the baseline the step's peak is measured above."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return resident_set_kib("VmRSS") * 1024


def peak_memory(case_key: str, stepper: str, algorithms: list[str], device: str, steps: int) -> int:
    return peak_memory_in_child(
        "bench.step_time",
        ["--memory-child", case_key, stepper, "--device", device, "--algorithms", *algorithms, "--steps", str(steps)],
    )


def peak_memory_in_child(module: str, arguments: list[str], *, return_freed_memory: bool = False) -> int:
    """Run ``python -m module *arguments`` in a fresh process; its last stdout line is ``{"peak_bytes": n}``.

    ``return_freed_memory``: make glibc serve every block of 64 KiB or more with its own mapping,
    unmapped when freed, so the warm-up step's tensors do not stay resident and hide the next steps'
    peak (without it the heap keeps freed blocks and a step can reuse them unseen)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if return_freed_memory else None
    out = subprocess.run(
        [sys.executable, "-m", module, *arguments], capture_output=True, text=True, check=True, env=env
    )
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["dp-sgd"])
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="skip the timings (memory is unaffected by a busy machine, timings are not)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--memory-child", nargs=2, metavar=("CASE", "STEPPER"))
    args = parser.parse_args()
    if args.memory_child:
        peak_memory_child(*args.memory_child, args.algorithms, args.device, args.steps)
        return
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"device {device}{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
        f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}"
    )
    print("| case | stepper | ms/step | × non-private | peak memory × non-private |")
    print("|---|---|---|---|---|")
    for key in args.cases:
        case = CASES[key]
        table = steppers(args.algorithms)
        if args.memory_only:
            times = {name: float("nan") for name in table}
        else:
            runs = {name: make(case, device) for name, make in table.items()}
            times = {name: time_per_step(run, steps=args.steps, repeats=args.repeats) for name, run in runs.items()}
        memory = (
            {}
            if args.no_memory
            else {name: peak_memory(key, name, args.algorithms, args.device, args.steps) for name in table}
        )
        base_t, base_m = times["non-private"], memory.get("non-private")
        for name in table:
            mem = f"{memory[name] / max(base_m, 1):.2f} ({memory[name] / 2**20:.0f} MiB)" if memory else "—"
            print(
                f"| {case.name} | {name} | {times[name] * 1e3:.2f} | {times[name] / base_t:.2f} | {mem} |", flush=True
            )


if __name__ == "__main__":
    main()
