"""What the secure noise source costs: a whole DP-SGD step with each source, in one run.

Sources, timed interleaved in the same process (these machines are noisy: read the ratios):
- "torch mt19937 (old, UNSAFE)": the pre-audit source, PyTorch's generator for the device seeded
  with one integer (mt19937 keeps 32 bits of it on the CPU) — kept here for timing only;
- "SecureRandom": the job's source now (NumPy Philox with a 256-bit seed on the CPU, two keyed
  CUDA Philox generators on CUDA), with secure_gaussian off and on (4 draws per value).
For each model case it times the registered DP-SGD trainer (the code a job runs) per step, and
separately the raw cost of drawing 1e6 float32 Gaussians each way.

    .venv/bin/python -m bench.noise_source --threads 1
    .venv/bin/python -m bench.noise_source --device cuda
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from algorithms.trainers import TrainingRequest, get_trainer
from bench.step_time import CASES, N_ROWS, Case, _data, _model, _sync
from bench.timing import interleaved_medians
from dp.data.rows import TensorRows
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom, Shape
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate

DEFAULT_CASES = ("cnn-b128", "mlp-b256")


class LegacyTorchStream(SecureRandom):
    """UNSAFE, benchmarks only: the old source (a seeded torch.Generator) behind SecureRandom's
    interface, drawing exactly what the pre-audit code drew (torch.rand / torch.randn)."""

    def __init__(self, seed: int, device: torch.device) -> None:
        super().__init__(
            device=torch.device("cpu"),
            numpy_stream=np.random.Generator(np.random.Philox(seed)),
            master_key=bytes(32),
            pair=None,
            secure_gaussian=False,
        )
        self._device = device
        self._torch = torch.Generator(device=device).manual_seed(seed)

    def uniform(
        self, shape: Shape, *, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> torch.Tensor:
        size = (shape,) if isinstance(shape, int) else tuple(shape)
        return torch.rand(size, generator=self._torch, device=self._device, dtype=dtype)

    def normal(
        self, shape: Shape, *, std: float, dtype: torch.dtype = torch.float64, device: torch.device | str | None = None
    ) -> torch.Tensor:
        size = (shape,) if isinstance(shape, int) else tuple(shape)
        return torch.randn(size, generator=self._torch, device=self._device, dtype=dtype).mul_(std)


SOURCES: dict[str, Callable[[torch.device], SecureRandom]] = {
    "torch mt19937 (old, UNSAFE)": lambda device: LegacyTorchStream(2, device),
    "SecureRandom, secure_gaussian=False": lambda device: SecureRandom.from_seed(2, device, secure_gaussian=False),
    "SecureRandom, secure_gaussian=True": lambda device: SecureRandom.from_seed(2, device, secure_gaussian=True),
}


def dp_sgd_stepper(case: Case, device: torch.device, source: SecureRandom) -> Callable[[int], None]:
    """The registered DP-SGD trainer on the case, drawing from ``source``."""
    dataset = Dataset(
        n_rows=N_ROWS, feature_shape=list(case.input_shape), task="classification", n_classes=case.n_classes
    )
    spec = JobCreate.model_validate(
        {
            "dataset_id": "bench",
            "model": {"name": case.model, "params": case.params},
            "algorithm": {"name": "dp-sgd"},
            "privacy": {"noise_multiplier": 1.0},
            "training": {"steps": 1, "batch_size": case.batch_size, "learning_rate": 0.01},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-6, max_steps=10**9)
    model, (X, y) = _model(case, device), _data(case, device)
    trainer = get_trainer("dp-sgd")

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
                generator=source,
                hooks=TrainingHooks(),
                resume_from=None,
                device=device,
            )
        )
        _sync(device)

    return run


def gaussian_drawer(source: SecureRandom, device: torch.device, n: int) -> Callable[[int], None]:
    def run(times: int) -> None:
        for _ in range(times):
            source.normal(n, std=1.0, dtype=torch.float32)
        _sync(device)

    return run


def print_rows(what: str, medians: dict[str, float], unit: str, scale: float) -> None:
    base = medians[next(iter(medians))]
    for name, value in medians.items():
        print(f"| {what} | {name} | {value * scale:.2f} {unit} | {value / base:.3f} |", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=10, help="steps per timed sample")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--draws", type=int, default=1_000_000, help="Gaussians per raw draw")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 like the other benches)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"numpy {np.__version__}, device {device}"
        f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
        f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d')}"
    )
    print("| what | noise source | time | × old torch source |")
    print("|---|---|---|---|")
    for key in args.cases:
        case = CASES[key]
        runs = {name: dp_sgd_stepper(case, device, make(device)) for name, make in SOURCES.items()}
        medians = interleaved_medians(runs, per_sample=args.steps, repeats=args.repeats)
        print_rows(f"DP-SGD step, {case.name}", medians, "ms/step", 1e3)
    draws = {name: gaussian_drawer(make(device), device, args.draws) for name, make in SOURCES.items()}
    medians = interleaved_medians(draws, per_sample=5, repeats=args.repeats)
    print_rows(f"{args.draws:.0e} float32 Gaussians", medians, "ms", 1e3)


if __name__ == "__main__":
    main()
