"""Peak memory of one clipped-sum step of the ghost engine, relative to a non-private step.

Why: the GPU goal is a DP step's peak memory at most 1.5× the non-private one, and what the
engine keeps (each layer's inputs, output gradients, Gram matrices or per-sample gradients) is
the same on any device, so the ratio can be worked on without a GPU. Every (case, stepper) runs
in a fresh process: after one warm-up step the peak mark is reset and the figure is the peak
during two more steps above the memory held before them. On a CPU that is the resident set
(VmHWM) with glibc told to return every freed block of 64 KiB or more to the kernel
(``MALLOC_MMAP_THRESHOLD_``), so a warm-up's freed tensors cannot hide a step's peak; on a GPU
it is ``torch.cuda.max_memory_allocated``. Memory does not depend on machine load.

    .venv/bin/python -m bench.ghost_memory --cases wrn16-4 resnet-gn vit --batch 32
    python -m bench.ghost_memory --device cuda --batch 256
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys

import torch

from bench.engine_compare import CASES as ENGINE_CASES
from bench.engine_compare import Step, ghost_engine, nonprivate
from bench.step_time import peak_bytes_of_steps, peak_memory_in_child

CASES = {
    "cnn2-gn": ENGINE_CASES["cnn-b128"],
    "cnn3": ENGINE_CASES["cnn3-b256"],
    "wrn16-4": ENGINE_CASES["wrn16-4-b256"],
    "resnet-gn": ENGINE_CASES["resnet-gn-b256"],
    "vit": ENGINE_CASES["vit-b256"],
    "tcls": ENGINE_CASES["tcls-t64-b512"],
    "tlm": ENGINE_CASES["tlm-t256-b64"],
}
STEPPERS = ("non-private", "ghost")


def _stepper(case_key: str, stepper: str, batch: int, device: torch.device) -> Step:
    case = dataclasses.replace(CASES[case_key], batch=batch)
    if stepper == "non-private":
        return nonprivate(case, device)
    return ghost_engine(case, device, "bk", batch)


def _child(case_key: str, stepper: str, batch: int, device: torch.device) -> int:
    """Bytes two steps hold at their peak above what was held before them (module docstring)."""
    step = _stepper(case_key, stepper, batch, device)

    def run(steps: int) -> None:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return peak_bytes_of_steps(run, device=device, steps=2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["cnn2-gn", "wrn16-4", "resnet-gn", "vit", "tcls"], choices=CASES)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "STEPPER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.child is not None:
        print(json.dumps({"peak_bytes": _child(args.child[0], args.child[1], args.batch, device)}))
        return
    print(f"- device {device}, batch {args.batch}, torch {torch.__version__}, {datetime.date.today()}")
    print("- command: `python -m bench.ghost_memory " + " ".join(argv if argv is not None else sys.argv[1:]) + "`\n")
    print("| case | non-private MiB | ghost (bk) MiB | × non-private |")
    print("|---|---:|---:|---:|")
    for key in args.cases:
        peaks = {
            stepper: peak_memory_in_child(
                "bench.ghost_memory",
                ["--child", key, stepper, "--batch", str(args.batch), "--device", args.device],
                return_freed_memory=device.type == "cpu",
            )
            for stepper in STEPPERS
        }
        base, ghost = peaks["non-private"], peaks["ghost"]
        print(f"| {key} | {base / 2**20:.0f} | {ghost / 2**20:.0f} | {ghost / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
