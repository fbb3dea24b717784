"""Gram form or materialised per-sample gradients, layer by layer: what each costs, and which
cost model picks the faster one.

The ghost engine has two exact forms for a Linear-on-sequences or Conv layer (T positions, k
inputs and o outputs per position and group): materialising every row's gradient (T·o·k flops
per row in many small GEMMs, o·k values written and kept per row), or the Gram form (T²·(k + o)
flops, 2·T² values written; the book-keeping sum is then one large GEMM of T·o·k flops on the
kept inputs, or for a conv its own batch weight-gradient kernel).
`dp.per_example.ghost.linear_conv._use_gram` picks one from flops plus `write_cost` flops per
value a form writes (``WRITE_COST_FLOPS``, per device type). This
benchmark records the (a, δ) of every such layer of a zoo model on one batch, times both forms
(the layer's norm and its book-keeping sum, interleaved), and for each candidate write cost says
how much slower its picks are than the faster form of every layer; the kept megabytes show the
memory side (a chunk holds every layer's kept tensors until the scales are known).

Per-layer timings miss what a materialised layer costs the rest of the step (its gradients are
held through the backward and read twice more), so ``--whole-steps`` times whole clipped-sum
steps instead: for each case, a non-private step and the ghost engine's step at each candidate
write cost, interleaved in turn (bench/timing.py), as ratios to the non-private step.

    .venv/bin/python -m bench.gram_choice --cases wrn16-4 vit cnn3 tcls --batch 32
    .venv/bin/python -m bench.gram_choice --whole-steps --cases vit tcls wrn16-4 --batch 32
    python -m bench.gram_choice --device cuda --batch 256        # on a GPU
    python -m bench.gram_choice --device cuda --batch 256 --whole-steps
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import torch

from bench.engine_compare import CASES as ENGINE_CASES
from bench.engine_compare import Case, Step, ghost_engine, nonprivate
from bench.timing import interleaved_medians
from dp.per_example.ghost import ghost_clipped_grad_sum, linear_conv, work
from dp.per_example.ghost.work import Totals
from dp.per_example.per_sample import AbadiClip
from privtrain_common.zoo.architectures import build_model

CASES = {
    "wrn16-4": ENGINE_CASES["wrn16-4-b256"],
    "resnet-gn": ENGINE_CASES["resnet-gn-b256"],
    "vit": ENGINE_CASES["vit-b256"],
    "cnn3": ENGINE_CASES["cnn3-b256"],
    "cnn2-gn": ENGINE_CASES["cnn-b128"],
    "tcls": ENGINE_CASES["tcls-t64-b512"],
    "tlm": ENGINE_CASES["tlm-t256-b64"],
}
WRITE_COSTS = (0, 4, 16, 32, 64, 128, 256)


@dataclass
class Layer:
    """One recorded call of `_grouped_work`: the shapes and both forms, ready to run."""

    shape: tuple[int, int, int, int, int]  # (B, g, T, k, o)
    materialised: Callable[[], None]
    gram: Callable[[], None]
    kept_mb: tuple[float, float]  # (materialised G, Gram inputs and output gradients)
    patches: bool  # a conv's inputs per position, rebuilt from its input (see `_use_gram`)
    patch_sum: bool  # the Gram form's sum is a GEMM on those inputs (a conv's uses its own kernel)


def _record(case: Case, device: torch.device, batch: int) -> list[Layer]:
    """Run one ghost clipped sum and keep the arguments of every layer that has two forms."""
    gen = torch.Generator().manual_seed(0)
    model = build_model(case.model, case.params, input_shape=case.input_shape, n_outputs=case.n_classes, generator=gen)
    model = model.to(device)
    if case.vocab:
        X = torch.randint(1, case.vocab, (batch, *case.input_shape), generator=gen)
    else:
        X = torch.randn(batch, *case.input_shape, generator=gen)
    per_token = case.loss.startswith("token")
    y = torch.randint(0, case.n_classes, (batch, *case.input_shape) if per_token else (batch,), generator=gen)
    layers: list[Layer] = []
    original = linear_conv._grouped_work

    def recording(names, weight_shape, D, *, k, bk, per_sample_grads, inputs, patches=False, weighted_sums=None):  # noqa: ANN001, ANN202
        batch_, groups, positions, o = D.shape
        if names["weight"] is not None and positions > 1:
            weights = torch.rand(1, batch_, device=D.device, dtype=D.dtype)

            def run(form: str) -> Callable[[], None]:
                def once() -> None:
                    argument = (
                        {"G": per_sample_grads()} if form == "mat" else {"A": inputs(), "weighted_sums": weighted_sums}
                    )
                    work = linear_conv._positional_work(names["weight"], names["bias"], weight_shape, D, **argument)
                    work.accumulate(weights, None, [Totals()])
                    work.sq_norms.sum().item()  # waits for the device

                return once

            mat_mb = batch_ * groups * o * k * 4 / 2**20
            gram_mb = batch_ * groups * positions * (k + o) * 4 / 2**20
            shape = (batch_, groups, positions, k, o)
            layers.append(Layer(shape, run("mat"), run("gram"), (mat_mb, gram_mb), patches, weighted_sums is None))
        return original(
            names,
            weight_shape,
            D,
            k=k,
            bk=bk,
            per_sample_grads=per_sample_grads,
            inputs=inputs,
            patches=patches,
            weighted_sums=weighted_sums,
        )

    with mock.patch.object(linear_conv, "_grouped_work", recording):
        ghost_clipped_grad_sum(
            model,
            X.to(device),
            y.to(device),
            loss=case.loss,
            per_sample_map=AbadiClip(1.0),
            max_physical_batch_size=batch,
        )
    return layers


def _time(layer: Layer, repeats: int) -> tuple[float, float]:
    samples: dict[str, list[float]] = {"mat": [], "gram": []}
    layer.materialised()
    layer.gram()
    for _ in range(repeats):
        for name, run in (("mat", layer.materialised), ("gram", layer.gram)):
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return statistics.median(samples["mat"]), statistics.median(samples["gram"])


def _picks_gram(layer: Layer, write_cost: int) -> bool:
    batch, groups, positions, k, o = layer.shape
    with mock.patch.dict(linear_conv.WRITE_COST_FLOPS, {"bench": write_cost}):
        return linear_conv._use_gram(
            batch,
            groups,
            positions,
            k,
            o,
            bk=True,
            device_type="bench",
            patches=layer.patches,
            patch_sum=layer.patch_sum,
        )


def _whole_steps(case: Case, device: torch.device, write_costs: tuple[int, ...], repeats: int) -> dict[str, float]:
    """Median ms of a non-private step and of the ghost step at each write cost (interleaved)."""
    reference, ghost = nonprivate(case, device), ghost_engine(case, device, "bk", case.batch)

    def runs_of(step: Step, cost: int | None) -> Callable[[int], None]:
        def run(steps: int) -> None:
            with mock.patch.dict(work.WRITE_COST_FLOPS, {} if cost is None else {device.type: cost}):
                for _ in range(steps):
                    step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return run

    runs = {"non-private": runs_of(reference, None), **{str(c): runs_of(ghost, c) for c in write_costs}}
    return {name: s * 1e3 for name, s in interleaved_medians(runs, per_sample=1, repeats=repeats).items()}


def _print_whole_steps(keys: list[str], batch: int | None, device: torch.device, repeats: int) -> None:
    costs = (0, 32, 128, 512)
    print("\n| case | non-private ms | " + " | ".join(f"write cost {c}: × non-private" for c in costs) + " |")
    print("|---|---:|" + "---:|" * len(costs))
    for key in keys:
        case = CASES[key] if batch is None else dataclasses.replace(CASES[key], batch=batch)
        medians = _whole_steps(case, device, costs, repeats)
        base = medians["non-private"]
        ratios = " | ".join(f"{medians[str(c)] / base:.3f}" for c in costs)
        print(f"| {key} | {base:.1f} | {ratios} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["wrn16-4", "vit", "cnn3", "cnn2-gn", "tcls"], choices=CASES)
    parser.add_argument("--batch", type=int, default=None, help="rows per chunk (default: the case's batch)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="also write every layer's shape and timings here")
    parser.add_argument("--whole-steps", action="store_true", help="time whole clipped-sum steps per write cost")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    current = linear_conv.WRITE_COST_FLOPS.get(device.type, 0)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, device {device}"
        f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, {torch.get_num_threads()} "
        f"thread(s), medians of {args.repeats}, {time.strftime('%Y-%m-%d')}; write cost now {current}"
    )
    if args.whole_steps:
        _print_whole_steps(args.cases, args.batch, device, args.repeats)
        return
    print("\n| case | B, g, T, k, o | materialised ms | Gram ms | kept MB (mat / Gram) | picked now |")
    print("|---|---|---:|---:|---:|---|")
    totals = {cost: 0.0 for cost in WRITE_COSTS}
    best_total = 0.0
    raw: list[dict[str, object]] = []
    for key in args.cases:
        case = CASES[key]
        layers = _record(case, device, args.batch or case.batch)
        for layer in layers:
            mat, gram = _time(layer, args.repeats)
            best_total += min(mat, gram)
            raw.append({"case": key, "shape": layer.shape, "materialised_s": mat, "gram_s": gram})
            for cost in WRITE_COSTS:
                totals[cost] += gram if _picks_gram(layer, cost) else mat
            picked = "Gram" if _picks_gram(layer, current) else "materialised"
            print(
                f"| {key} | {', '.join(map(str, layer.shape))} | {mat * 1e3:.2f} | {gram * 1e3:.2f} | "
                f"{layer.kept_mb[0]:.1f} / {layer.kept_mb[1]:.1f} | {picked} |",
                flush=True,
            )
    print("\n| write cost (flops per value written) | time of its picks × the faster form of every layer |")
    print("|---:|---:|")
    for cost, total in totals.items():
        print(f"| {cost} | {total / best_total:.3f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(raw, out, indent=2)


if __name__ == "__main__":
    main()
