"""DiceSGD's step time relative to a non-private SGD step (and to DP-SGD), measured in one run.

Every stepper of a case runs in the same process, interleaved repeat by repeat (so drift of a
shared machine hits all of them alike); the reported number is the median over repeats of the
mean time per step:

- ``non-private``: an SGD step on a Poisson batch of the same expected size (bench.step_time);
- ``dp-sgd``: the registered dp-sgd trainer (ghost clipping where exact, as jobs run it);
- ``dicesgd``, ``dicesgd-adam``, ``dicesgd-auto``: the registered trainers, as a job runs them,
  with the plan built by the API's own planner (ghost engine where exact: two book-keeping
  passes, weights w_i and 1 − w_i);
- ``dp-sgd (vmap)``, ``dicesgd (vmap)``: both forced onto the materialising vmap engine (used for
  layers ghost clipping does not cover): DiceSGD's one-pass 2×m contraction vs DP-SGD's.

The last column compares each DiceSGD variant with DP-SGD on the same engine.

    .venv/bin/python -m bench.dicesgd_step_time --steps 10 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable

import torch

from bench.step_time import CASES, Case, _data, _model, _sync, algorithm_stepper, nonprivate_stepper
from bench.timing import interleaved_medians
from worker.optimizers.dicesgd import ErrorFeedbackAggregator, ErrorFeedbackClip, train_dicesgd
from worker.optimizers.dp_sgd import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from worker.optimizers.per_sample import AbadiClip
from worker.optimizers.secure_random import SecureRandom

Stepper = Callable[[int], None]
LOCAL_CASES = {
    "logreg-b256": Case("logistic regression on 784 features, B=256", "logistic-regression", {}, (784,), 10, 256),
    **CASES,
}


def _vmap_stepper(dice: bool) -> Callable[[Case, torch.device], Stepper]:
    """DP-SGD or DiceSGD (C1 = C2 = 1) forced onto the materialising vmap engine."""

    def make(case: Case, device: torch.device) -> Stepper:
        model, (X, y) = _model(case, device), _data(case, device)
        generator = SecureRandom.from_seed(3, device)
        n = X.shape[0]
        batch = float(case.batch_size)
        aggregator = (
            ErrorFeedbackAggregator(
                per_sample_map=AbadiClip(1.0),
                feedback_map=ErrorFeedbackClip(1.0),
                expected_batch_size=batch,
                engine="vmap",
            )
            if dice
            else None
        )

        def run(steps: int) -> None:
            config = DPSGDConfig(
                steps=steps,
                sampling_probability=batch / n,
                noise_multiplier=1.0,
                clipping_norm=1.0,
                learning_rate=0.01,
                max_physical_batch_size=case.batch_size,
                expected_batch_size=batch,
            )
            if aggregator is not None:
                train_dicesgd(model, X, y, config=config, aggregator=aggregator, generator=generator, device=device)
            else:
                train_dp_sgd(
                    model,
                    X,
                    y,
                    config=config,
                    generator=generator,
                    device=device,
                    aggregator=PerSampleMapAggregator(AbadiClip(1.0)),
                )
            _sync(device)

        return run

    return make


def steppers() -> dict[str, Callable[[Case, torch.device], Stepper]]:
    return {
        "non-private": nonprivate_stepper,
        "dp-sgd": algorithm_stepper("dp-sgd"),
        "dicesgd": algorithm_stepper("dicesgd"),
        "dicesgd-adam": algorithm_stepper("dicesgd-adam"),
        "dicesgd-auto": algorithm_stepper("dicesgd-auto"),
        "dp-sgd (vmap)": _vmap_stepper(dice=False),
        "dicesgd (vmap)": _vmap_stepper(dice=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["logreg-b256", "mlp-b256", "cnn-b128"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, device {device}"
        f"{' ' + torch.cuda.get_device_name() if device.type == 'cuda' else ''}, "
        f"{torch.get_num_threads()} thread(s), {args.steps} steps × {args.repeats} interleaved repeats, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    print("| case | stepper | ms/step | × non-private | × dp-sgd on the same engine |")
    print("|---|---|---|---|---|")
    results = {}
    for key in args.cases:
        case = LOCAL_CASES[key]
        runs = {name: make(case, device) for name, make in steppers().items()}
        times = interleaved_medians(runs, per_sample=args.steps, repeats=args.repeats)
        results[key] = times
        for name, seconds in times.items():
            same_engine = "dp-sgd (vmap)" if name.endswith("(vmap)") else "dp-sgd"
            versus = "—" if name == "non-private" else f"{seconds / times[same_engine]:.2f}"
            print(
                f"| {case.name} | {name} | {seconds * 1e3:.2f} | {seconds / times['non-private']:.2f} | {versus} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
