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

import torch

from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip, train_dicesgd
from bench.step_tables import MakeStepper, Stepper, step_table_main
from bench.step_time import CASES, Case, _data, _model, _sync, algorithm_stepper, nonprivate_stepper
from dp.loop.batch_loop import DPSGDConfig, PerSampleMapAggregator, train_dp_sgd
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom

LOCAL_CASES = {
    "logreg-b256": Case("logistic regression on 784 features, B=256", "logistic-regression", {}, (784,), 10, 256),
    **CASES,
}


def _vmap_stepper(dice: bool) -> MakeStepper:
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


def steppers() -> dict[str, MakeStepper]:
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
    step_table_main(
        __doc__ or "",
        cases=LOCAL_CASES,
        default_cases=["logreg-b256", "mlp-b256", "cnn-b128"],
        steppers=lambda args: steppers(),
        versus=lambda name: "dp-sgd (vmap)" if name.endswith("(vmap)") else "dp-sgd",
        versus_title="× dp-sgd on the same engine",
    )


if __name__ == "__main__":
    main()
