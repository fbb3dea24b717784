"""DC-DPSGD's step time on each per-sample gradient engine, against DP-SGD and a non-private step.

DC-DPSGD projects every row's whole gradient, so it needs the gradients themselves, not only a
clipped sum. They come either from the vmap engine (one autograd per row, vmapped) or from the
ghost engine's records (one batched forward and output-gradient backward, then one GEMM per layer:
`iter_ghost_per_sample_grads`); jobs use the ghost engine wherever it is exact ("auto"). All the
steppers of a case run in one process, interleaved repeat by repeat, so the ratios hold on a noisy
machine:

- ``non-private``: an SGD step on a Poisson batch of the same expected size (bench.step_time);
- ``dp-sgd``: the registered dp-sgd trainer, as a job runs it (ghost clipping);
- ``dc-dpsgd``, ``dc-dpsgd-threshold``: the registered trainers, as a job runs them (k = 200);
- ``… (vmap)`` and ``… (ghost)``: the same rules in the DP-SGD loop with the engine forced.

    .venv/bin/python -m bench.dc_dpsgd_step_time --cases cnn-b128 --steps 5 --repeats 5
"""

from __future__ import annotations

import torch

from algorithms.dc_dpsgd.aggregators import RankAggregator, ThresholdAggregator
from algorithms.dc_dpsgd.projection import StreamingProjection
from bench.step_tables import MakeStepper, Stepper, step_table_main
from bench.step_time import CASES, N_ROWS, Case, _data, _model, _sync, algorithm_stepper, nonprivate_stepper
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.per_example.engines import Engine
from dp.randomness.secure_random import SecureRandom

K = 200  # the catalogue's default subspace dimension


def _forced(rule: str, engine: Engine) -> MakeStepper:
    """A DC-DPSGD rule (catalogue defaults: c1 = 1, c2 = 0.1, p = 0.1) on the given engine."""

    def make(case: Case, device: torch.device) -> Stepper:
        model, (X, y) = _model(case, device), _data(case, device)
        generator = SecureRandom.from_seed(5, device)
        projection = StreamingProjection(k=K)
        aggregator: RankAggregator | ThresholdAggregator = (
            RankAggregator(c1=1.0, c2=0.1, projection=projection, p=0.1, engine=engine)
            if rule == "rank"
            else ThresholdAggregator(c1=1.0, c2=0.1, projection=projection, engine=engine)
        )

        def run(steps: int) -> None:
            config = DPSGDConfig(
                steps=steps,
                sampling_probability=case.batch_size / N_ROWS,
                noise_multiplier=1.0,
                clipping_norm=aggregator.sensitivity,
                learning_rate=0.01,
                max_physical_batch_size=2 * case.batch_size,  # one chunk, as a GPU worker takes it
                expected_batch_size=float(case.batch_size),
            )
            train_dp_sgd(model, X, y, config=config, generator=generator, device=device, aggregator=aggregator)
            _sync(device)

        return run

    return make


def steppers(engines: list[str]) -> dict[str, MakeStepper]:
    table: dict[str, MakeStepper] = {
        "non-private": nonprivate_stepper,
        "dp-sgd": algorithm_stepper("dp-sgd"),
        "dc-dpsgd": algorithm_stepper("dc-dpsgd"),
        "dc-dpsgd-threshold": algorithm_stepper("dc-dpsgd-threshold"),
    }
    for engine in engines:
        table[f"dc-dpsgd ({engine})"] = _forced("rank", engine)  # type: ignore[arg-type]
        table[f"dc-dpsgd-threshold ({engine})"] = _forced("threshold", engine)  # type: ignore[arg-type]
    return table


def main() -> None:
    step_table_main(
        __doc__ or "",
        cases=CASES,
        default_cases=["cnn-b128", "mlp-b256"],
        steppers=lambda args: steppers(args.engines),
        versus=lambda name: "dp-sgd",
        versus_title="× dp-sgd",
        add_arguments=lambda parser: parser.add_argument(
            "--engines", nargs="+", default=["vmap", "ghost"], choices=["vmap", "ghost"]
        ),
    )


if __name__ == "__main__":
    main()
