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
    python -m bench.training_loop_profile --algorithm dicesgd --model cnn2-gn --batch 512 --chunk 512

The op and kernel counts per step are the same on any machine for a given model and code (kernels
only on a GPU), so the CPU can show the launches a change removes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile

from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip, train_dicesgd
from dp.data.rows import TensorRows
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model

SCOPES = ("privtrain.sample", "privtrain.clipped_sum", "privtrain.noise_and_update", "privtrain.hooks")
INPUTS = {"cnn2-gn": (1, 28, 28)}


def _train(
    model: torch.nn.Module,
    rows: TensorRows,
    y: torch.Tensor,
    config: DPSGDConfig,
    device: torch.device,
    *,
    algorithm: str,
) -> None:
    generator = SecureRandom.from_os_entropy(device, secure_gaussian=True)
    if algorithm == "dicesgd":  # its ψ(e) and e update run inside the clipped_sum part
        assert config.expected_batch_size is not None
        aggregator = ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(config.clipping_norm),
            feedback_map=ErrorFeedbackClip(config.clipping_norm),
            expected_batch_size=config.expected_batch_size,
        )
        train_dicesgd(model, rows, y, config=config, aggregator=aggregator, generator=generator, device=device)
    else:
        train_dp_sgd(model, rows, y, config=config, generator=generator, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _enclosing_scope(event: FunctionEvent) -> str | None:
    parent: FunctionEvent | None = event
    while parent is not None:
        if parent.name in SCOPES:
            return parent.name
        parent = parent.cpu_parent
    return None


def ops_per_scope(events: list[FunctionEvent]) -> dict[str, tuple[int, int]]:
    """scope → (top-level aten ops dispatched, device kernels launched) over the profiled run.

    Each top-level op is a trip through the dispatcher and, on a GPU, one or more kernel launches
    paid by the host: for a launch-bound step this count, not the FLOP, sets the time.
    """
    counts = {scope: [0, 0] for scope in SCOPES}
    for event in events:
        scope = _enclosing_scope(event)
        if scope is None or event.name == scope:
            continue
        parent = event.cpu_parent
        if event.name.startswith("aten::") and not (parent is not None and parent.name.startswith("aten::")):
            counts[scope][0] += 1
        counts[scope][1] += len(event.kernels)
    return {scope: (ops, kernels) for scope, (ops, kernels) in counts.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wrn")
    parser.add_argument("--params", type=json.loads, default={})
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1024, help="expected batch size (Poisson)")
    parser.add_argument("--chunk", type=int, default=256, help="max_physical_batch_size")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--algorithm", choices=("dp-sgd", "dicesgd"), default="dp-sgd")
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
        expected_batch_size=float(args.batch),
    )
    warm_up = dataclasses.replace(config, steps=2)  # one-off costs
    _train(model, rows, y, warm_up, device, algorithm=args.algorithm)
    started = time.perf_counter()
    _train(model, rows, y, config, device, algorithm=args.algorithm)
    wall_ms = (time.perf_counter() - started) / args.steps * 1e3
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        _train(model, rows, y, config, device, algorithm=args.algorithm)
    events = {e.key: e for e in prof.key_averages() if e.key in SCOPES}
    print(
        f"# {args.algorithm}, {args.model} {json.dumps(args.params)}, expected batch {args.batch}, "
        f"chunk {args.chunk}, {device}"
    )
    print(f"wall time per step (unprofiled): {wall_ms:.1f} ms\n")
    counts = ops_per_scope(list(prof.events()))
    print("| part | host ms / step | device ms / step | aten ops / step | kernels / step |")
    print("|---|---:|---:|---:|---:|")
    for scope in SCOPES:
        event = events.get(scope)
        if event is None:
            continue
        host = event.cpu_time_total / args.steps / 1e3
        on_device = event.device_time_total / args.steps / 1e3
        ops, kernels = (count / args.steps for count in counts[scope])
        name = scope.removeprefix("privtrain.")
        print(f"| {name} | {host:.1f} | {on_device:.1f} | {ops:.0f} | {kernels:.0f} |")


if __name__ == "__main__":
    main()
