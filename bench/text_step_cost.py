"""Step time and peak memory of DP fine-tuning (full and LoRA) of a text transformer, against non-private.

Why: a language model's per-sample gradient norms are where DP costs most at long sequences, and
LoRA is meant to make private fine-tuning cheap. For a `transformer-lm` on random byte-token rows
(public synthetic data, right-padded like an uploaded text dataset: sizes matter, not content), at
each sequence length it times, in one process and interleaved (bench/timing.py):

- non-private SGD through the registered ``sgd`` trainer, full model and LoRA adapters;
- ``dp-sgd`` through its registered trainer (ghost clipping where the engine supports the model),
  full model and LoRA adapters, with the job's plan built by the API's own planner;
- DP-SGD through Opacus's PrivacyEngine (hooks mode, Poisson sampling) on the full model, as the
  outside reference (reported as failed, not fatal, where Opacus cannot take the model).

LoRA is applied as the worker applies ``training.finetune: lora`` after loading a base model
(training/finetune.py); the base weights here are the random initialisation, which changes
nothing in a step's cost. Peak memory is measured per stepper in a fresh process, as in
bench/step_time.py.

    .venv/bin/python -m bench.text_step_cost --steps 2 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from algorithms.trainers import TrainingRequest, get_trainer
from bench.step_time import _sync, opacus_run, peak_bytes_of_steps, peak_memory_in_child
from bench.timing import interleaved_medians
from dp.data.tokens import IGNORED_TARGET, TokenRows, language_model_targets
from dp.loop.state import TrainingHooks
from dp.losses import get_loss, loss_for_task
from dp.randomness.secure_random import SecureRandom
from kernel.config import get_settings
from kernel.datasets.stored_facts import facts_of
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.model_catalogue import ModelSizeLimits, get_model
from kernel.schemas.jobs import JobCreate
from kernel.tokenizers.byte import PAD_ID, VOCAB_SIZE
from privtrain_common.zoo.architectures import build_model
from training.finetune import apply_finetune

N_ROWS = 1024
MODEL = "transformer-lm"
MODEL_PARAMS: dict[str, object] = {
    "layers": 2,
    "dim": 128,
    "heads": 4,
    "mlp_dim": 256,
    "vocab_size": VOCAB_SIZE,
    "pad_id": PAD_ID,
}
LORA = {"rank": 8, "alpha": 16}
TASK = "language-model"

Finetune = Literal["full", "lora"]
StepRun = Callable[[int], None]


@dataclass(frozen=True)
class TextCase:
    name: str
    max_length: int
    batch_size: int


CASES = {
    "lm-t128": TextCase("transformer-lm T=128, B=32", 128, 32),
    "lm-t512": TextCase("transformer-lm T=512, B=32", 512, 32),
}


def token_rows(case: TextCase) -> np.ndarray:
    """uint16 (N_ROWS, T) byte ids, each row real for a random length in [T/2, T], then pad."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (N_ROWS, case.max_length), generator=g)
    lengths = torch.randint(case.max_length // 2, case.max_length + 1, (N_ROWS, 1), generator=g)
    ids[torch.arange(case.max_length) >= lengths] = PAD_ID
    return ids.numpy().astype(np.uint16)


def text_model(case: TextCase, device: torch.device, *, finetune: Finetune) -> nn.Module:
    model = build_model(
        MODEL,
        MODEL_PARAMS,
        input_shape=(case.max_length,),
        n_outputs=VOCAB_SIZE,
        generator=torch.Generator().manual_seed(0),
    )
    apply_finetune(model, mode=finetune, lora=LORA)
    return model.to(device)


def trainer_stepper(algorithm: str, *, finetune: Finetune) -> Callable[[TextCase, torch.device], StepRun]:
    """Steps of the registered trainer ``algorithm``, as a job on a text dataset runs them."""

    def make(case: TextCase, device: torch.device) -> StepRun:
        private = algorithm != "sgd"
        dataset = Dataset(
            n_rows=N_ROWS,
            feature_shape=[case.max_length],
            task=TASK,
            modality="text",
            vocab_size=VOCAB_SIZE,
            pad_id=PAD_ID,
            public=not private,
        )
        spec = JobCreate.model_validate(
            {
                "dataset_id": "bench",
                "model": {"name": MODEL, "params": MODEL_PARAMS},
                "algorithm": {"name": algorithm},
                **({"privacy": {"noise_multiplier": 1.0}} if private else {}),
                # finetune is applied to the model below: the planner asks for model.init with it,
                # and the price does not depend on which parameters train
                "training": {"steps": 1, "batch_size": case.batch_size, "learning_rate": 0.01},
            }
        )
        limits = ModelSizeLimits.from_settings(get_settings())
        plan = plan_job(spec, dataset, dataset_delta=1e-6, max_steps=10**9, model_limits=limits)
        # the worker's rows per chunk under the service's default limits (about 160 at T = 512)
        chunk = get_model(MODEL).rows_per_chunk(plan.spec["model"]["params"], facts_of(dataset), limits=limits)
        rows = TokenRows(token_rows(case), device=device, resident=device.type == "cuda")
        targets = language_model_targets(rows, pad_id=PAD_ID)
        model = text_model(case, device, finetune=finetune)
        trainer = get_trainer(algorithm)
        generator = SecureRandom.from_seed(2, device)

        def run(steps: int) -> None:
            trainer(
                TrainingRequest(
                    model=model,
                    features=rows,
                    y=targets,
                    task=TASK,
                    hyperparameters=plan.hyperparameters,
                    training=plan.training,
                    noise_multiplier=plan.noise_multiplier,
                    sampling_probability=plan.plan.sampling_probability,
                    expected_batch_size=plan.plan.expected_batch_size,
                    steps=steps,
                    max_physical_batch_size=chunk,
                    generator=generator,
                    hooks=TrainingHooks(),
                    resume_from=None,
                    device=device,
                )
            )
            _sync(device)

        return run

    return make


def opacus_stepper(case: TextCase, device: torch.device) -> StepRun:
    """Opacus DP-SGD on the full model with the same per-row loss (a row's mean token loss)."""
    ids = torch.from_numpy(token_rows(case).astype(np.int64))
    targets = ids.masked_fill(ids == PAD_ID, IGNORED_TARGET)
    row_losses = get_loss(loss_for_task(TASK)).fn
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(ids.to(device), targets.to(device)), batch_size=case.batch_size
    )
    return opacus_run(
        text_model(case, device, finetune="full"),
        loader,
        loss=lambda outputs, labels: row_losses(outputs, labels) / max(1, len(labels)),
        device=device,
        free_per_sample_grads=True,
    )


STEPPERS: dict[str, Callable[[TextCase, torch.device], StepRun]] = {
    "non-private sgd, full": trainer_stepper("sgd", finetune="full"),
    f"non-private sgd, LoRA r={LORA['rank']}": trainer_stepper("sgd", finetune="lora"),
    "dp-sgd, full": trainer_stepper("dp-sgd", finetune="full"),
    f"dp-sgd, LoRA r={LORA['rank']}": trainer_stepper("dp-sgd", finetune="lora"),
    "opacus dp-sgd (hooks), full": opacus_stepper,
}
BASELINE = "non-private sgd, full"


def peak_memory_child(case_key: str, stepper: str, device: str, steps: int) -> None:
    dev = torch.device(device)
    run = STEPPERS[stepper](CASES[case_key], dev)
    print(json.dumps({"peak_bytes": peak_bytes_of_steps(run, device=dev, steps=steps)}))


def peak_memory(case_key: str, stepper: str, device: str, steps: int) -> int | None:
    """Peak bytes of the stepper's steps in a fresh process; None when that process failed."""
    try:
        return peak_memory_in_child(
            "bench.text_step_cost",
            ["--memory-child", case_key, stepper, "--device", device, "--steps", str(steps)],
            return_freed_memory=True,
        )
    except Exception:  # noqa: BLE001 — a stepper the model does not fit (Opacus) is reported, not fatal
        return None


def build_runs(case: TextCase, device: torch.device) -> tuple[dict[str, StepRun], dict[str, str]]:
    """Every stepper that builds and takes one step, and why each of the others failed."""
    runs: dict[str, StepRun] = {}
    failed: dict[str, str] = {}
    for name, make in STEPPERS.items():
        try:
            run = make(case, device)
            run(1)
        except Exception as exc:  # noqa: BLE001 — reported in the table
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        runs[name] = run
    return runs, failed


def ratio(value: float | None, base: float | None) -> str:
    if value is None or base is None or math.isnan(value) or math.isnan(base):
        return "—"
    return f"{value / max(base, 1e-12):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--steps", type=int, default=2, help="steps per timed sample and per memory run")
    parser.add_argument("--repeats", type=int, default=3)
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
        case_key, stepper = args.memory_child
        peak_memory_child(case_key, stepper, args.device, args.steps)
        return
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# {platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"device {device}{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
        f"{torch.get_num_threads()} threads, {time.strftime('%Y-%m-%d %H:%M')}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print("| case | stepper | ms/step | × non-private full | peak memory (MiB) | × non-private full |")
    print("|---|---|---|---|---|---|")
    for key in args.cases:
        case = CASES[key]
        runs, failed = build_runs(case, device)
        times = (
            {name: math.nan for name in runs}
            if args.memory_only
            else interleaved_medians(runs, per_sample=args.steps, repeats=args.repeats)
        )
        memory = {} if args.no_memory else {name: peak_memory(key, name, args.device, args.steps) for name in runs}
        for name in STEPPERS:
            if name in failed:
                print(f"| {case.name} | {name} | failed: {failed[name]} | — | — | — |", flush=True)
                continue
            peak = memory.get(name)
            mib = "—" if peak is None else f"{peak / 2**20:.0f}"
            print(
                f"| {case.name} | {name} | {times[name] * 1e3:.0f} | {ratio(times[name], times.get(BASELINE))} "
                f"| {mib} | {ratio(peak, memory.get(BASELINE))} |",
                flush=True,
            )
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
