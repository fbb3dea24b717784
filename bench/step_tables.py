"""The command line and the Markdown table shared by the step-time benchmarks that compare
algorithm variants on the cases of bench.step_time (dicesgd_step_time, dc_dpsgd_step_time).

Every stepper of a case runs in one process, interleaved repeat by repeat (bench.timing), and each
row gives ms per step, the ratio to the case's ``non-private`` stepper and the ratio to the
stepper named by ``versus`` (the DP-SGD to compare with).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Mapping

import torch

from bench.step_time import Case
from bench.timing import interleaved_medians

Stepper = Callable[[int], None]
MakeStepper = Callable[[Case, torch.device], Stepper]


def step_table_main(
    description: str,
    *,
    cases: Mapping[str, Case],
    default_cases: list[str],
    steppers: Callable[[argparse.Namespace], Mapping[str, MakeStepper]],
    versus: Callable[[str], str],
    versus_title: str,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Parse the command line, time every stepper of every case, print the table (and --json)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=default_cases, choices=sorted(cases))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    if add_arguments is not None:
        add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, device {device}"
        f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
        f"{torch.get_num_threads()} thread(s), {args.steps} steps × {args.repeats} interleaved repeats, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print(f"| case | stepper | ms/step | × non-private | {versus_title} |")
    print("|---|---|---:|---:|---:|")
    results = {}
    for key in args.cases:
        case = cases[key]
        runs = {name: make(case, device) for name, make in steppers(args).items()}
        times = interleaved_medians(runs, per_sample=args.steps, repeats=args.repeats)
        results[key] = times
        for name, seconds in times.items():
            ratio = "" if name == "non-private" else f"{seconds / times[versus(name)]:.2f}"
            print(
                f"| {case.name} | {name} | {seconds * 1e3:.2f} | {seconds / times['non-private']:.2f} | {ratio} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
