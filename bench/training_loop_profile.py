"""Where a DP-SGD training loop's time goes, step part by step part, on the worker's own code.

Why: a whole job through the worker ran at 0.73× a plain Opacus loop on an H100 (wrn 16-4,
B = 1024, docs/benchmarks.md) while the engine alone is 2.4× faster than Opacus's at B = 256, so
most of a step's time there is outside the clipped sum. ``train_dp_sgd`` marks its parts with
profiler scopes (``privtrain.sample``, ``privtrain.clipped_sum``, ``privtrain.noise_and_update``,
``privtrain.hooks``); this runs it on the same model and batch, rows on the device as a GPU
worker places them, with Poisson sampling and secure noise from a ``SecureRandom``, and prints
each part's host and device time per step next to the wall time per step.

    python -m bench.training_loop_profile --model wrn --batch 1024 --chunk 256 --device cuda
    python -m bench.training_loop_profile --model cnn2-gn --batch 128 --steps 3 --device cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from privtrain.architectures import build_model
from worker.data.rows import TensorRows
from worker.optimizers.dp_sgd import DPSGDConfig, train_dp_sgd
from worker.optimizers.secure_random import SecureRandom

SCOPES = ("privtrain.sample", "privtrain.clipped_sum", "privtrain.noise_and_update", "privtrain.hooks")
INPUTS = {"cnn2-gn": (1, 28, 28)}


def _train(
    model: torch.nn.Module, rows: TensorRows, y: torch.Tensor, config: DPSGDConfig, device: torch.device
) -> None:
    train_dp_sgd(
        model,
        rows,
        y,
        config=config,
        generator=SecureRandom.from_os_entropy(device, secure_gaussian=True),
        device=device,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wrn")
    parser.add_argument("--params", type=json.loads, default={})
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1024, help="expected batch size (Poisson)")
    parser.add_argument("--chunk", type=int, default=256, help="max_physical_batch_size")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    shape = INPUTS.get(args.model, (3, 32, 32))
    model = build_model(args.model, args.params, input_shape=shape, n_outputs=10).to(device)
    g = torch.Generator().manual_seed(0)
    rows = TensorRows(torch.rand((args.rows, *shape), generator=g), device=device)
    y = torch.randint(0, 10, (args.rows,), generator=g)
    config = DPSGDConfig(
        steps=args.steps,
        sampling_probability=args.batch / args.rows,
        noise_multiplier=1.0,
        clipping_norm=1.0,
        learning_rate=0.1,
        max_physical_batch_size=args.chunk,
    )
    _train(model, rows, y, dataclasses.replace(config, steps=2), device)  # warm-up: one-off costs
    started = time.perf_counter()
    _train(model, rows, y, config, device)
    wall_ms = (time.perf_counter() - started) / args.steps * 1e3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _train(model, rows, y, config, device)
    events = {e.key: e for e in prof.key_averages() if e.key in SCOPES}
    print(f"# {args.model} {json.dumps(args.params)}, expected batch {args.batch}, chunk {args.chunk}, {device}")
    print(f"wall time per step (unprofiled): {wall_ms:.1f} ms\n")
    print("| part | host ms / step | device ms / step |")
    print("|---|---:|---:|")
    for scope in SCOPES:
        event = events.get(scope)
        if event is None:
            continue
        host = event.cpu_time_total / args.steps / 1e3
        on_device = event.device_time_total / args.steps / 1e3
        print(f"| {scope.removeprefix('privtrain.')} | {host:.1f} | {on_device:.1f} |")


if __name__ == "__main__":
    main()
