"""Where a DP step's GPU time goes: the torch profiler's top kernels per engine and case.

Why: before optimising the engine for a GPU, see which kernels take the time, in the same cases
as ``bench.engine_compare`` (non-private, our ghost engine with pass 2 = bk, Opacus hooks). Prints
one table per case and engine: the top operators by device time over a few profiled steps, and
the device time per step.

    python -m bench.gpu_profile --cases cnn3-b1024,wrn16-4-b256 --device cuda
    python -m bench.gpu_profile --cases cnn-b128 --device cpu      # the plumbing
"""

from __future__ import annotations

import argparse
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from bench.engine_compare import CASES, Step, ghost_engine, nonprivate, opacus_hooks


def _profile(step: Step, device: torch.device, steps: int, top: int) -> str:
    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    averages = prof.key_averages()
    total_us = sum(getattr(e, sort) for e in averages)
    table = averages.table(sort_by=sort, row_limit=top, max_name_column_width=70)
    where = "device" if device.type == "cuda" else "CPU"
    return f"self {where} time per step: {total_us / steps / 1e3:.2f} ms\n{table}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cnn3-b1024,wrn16-4-b256")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=18)
    parser.add_argument("--skip-opacus", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    for key in args.cases.split(","):
        case = CASES[key]
        engines = {
            "non-private": lambda case=case: nonprivate(case, device),
            "ghost bk": lambda case=case: ghost_engine(case, device, "bk", case.batch),
        }
        if not args.skip_opacus:
            engines["Opacus hooks"] = lambda case=case: opacus_hooks(case, device)
        for label, make in engines.items():
            text = _profile(make(), device, args.steps, args.top)
            print(f"\n### {case.label} · {label}\n\n```\n{text}\n```", flush=True)


if __name__ == "__main__":
    main()
