"""Privacy per person on a table with a heavy-tailed number of rows per person.

Why: a row-level run protects one row; a person with m rows then has only the group-privacy
guarantee of m rows. This builds a synthetic table (``--persons`` persons, rows per person drawn
from a discrete Pareto law, so a few persons have hundreds of rows; each person has their own
feature offset, so a person's rows are alike), trains logistic regression with DP-SGD at the same
target ε once per row (what a naive run does) and once per person (a privacy unit column, rows
averaged per person), each with the planner and the worker trainer the service uses (DP-SGD, or
with ``--algorithm`` DC-DPSGD or DiceSGD), and reports:

* the guarantee each run gives a person with m rows: per person, ε for everyone; per row, the
  group-privacy bound m·ε at δ' = m·e^{(m−1)ε}·δ (Dwork and Roth, Theorem 2.2 with its δ term);
* test accuracy on fresh persons (the synthetic test set is public), mean over ``--seeds``.

    .venv/bin/python -m bench.privacy_units --persons 3000 --epsilon 2 --seeds 3 [--algorithm dicesgd]
"""

from __future__ import annotations

import argparse
import math
import statistics

import numpy as np
import torch

from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.data.units import UnitIndex
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

FEATURES = 10
DELTA = 1e-6
ALGORITHMS: dict[str, dict[str, object]] = {
    "dp-sgd": {"clipping_norm": 1.0, "momentum": 0.9},
    "dc-dpsgd": {"c1": 1.0, "c2": 0.3, "k": 5, "p": 0.1, "momentum": 0.9},
    "dicesgd": {"c1": 1.0, "c2": 1.0, "momentum": 0.9},
}
"""The per-sample-gradient algorithms compared, each with its hyperparameters on this table."""


def heavy_tailed_table(persons: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y, person code per row): rows per person ~ 1 + Pareto(1.1), capped at 800."""
    counts = np.minimum(1 + np.floor(rng.pareto(1.1, size=persons)).astype(np.int64), 800)
    codes = np.repeat(np.arange(persons), counts)
    direction = np.ones(FEATURES) / math.sqrt(FEATURES)
    offsets = rng.normal(scale=1.0, size=(persons, FEATURES))
    X = offsets[codes] + rng.normal(scale=0.7, size=(codes.size, FEATURES))
    y = (X @ direction + 0.3 * rng.normal(size=codes.size) > 0).astype(np.int64)
    return X.astype(np.float32), y, codes


def train(
    X: np.ndarray,
    y: np.ndarray,
    codes: np.ndarray | None,
    *,
    algorithm: str,
    epsilon: float,
    batch: int,
    epochs: int,
    seed: int,
) -> torch.nn.Module:
    n_units = None if codes is None else int(codes.max()) + 1
    dataset = Dataset(
        n_rows=X.shape[0],
        n_units=n_units,
        privacy_unit_column=None if codes is None else "person",
        feature_shape=[FEATURES],
        task="classification",
        n_classes=2,
    )
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_bench",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": algorithm, "hyperparameters": ALGORITHMS[algorithm]},
            "privacy": {"target_epsilon": epsilon},
            "training": {"epochs": epochs, "batch_size": batch, "learning_rate": 0.5},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=DELTA, max_steps=100_000)
    model = build_model(
        "logistic-regression", {}, input_shape=(FEATURES,), n_outputs=2, generator=torch.Generator().manual_seed(seed)
    )
    get_trainer(algorithm)(
        TrainingRequest(
            model=model,
            features=TensorRows(torch.from_numpy(X)),
            y=torch.from_numpy(y),
            task="classification",
            hyperparameters=plan.hyperparameters,
            training=plan.training,
            noise_multiplier=plan.noise_multiplier,
            sampling_probability=plan.plan.sampling_probability,
            expected_batch_size=plan.plan.expected_batch_size,
            steps=plan.plan.steps,
            max_physical_batch_size=1024,
            generator=SecureRandom.from_seed(seed),
            hooks=TrainingHooks(),
            resume_from=None,
            device=torch.device("cpu"),
            units=None if codes is None else UnitIndex.from_codes(codes),
        )
    )
    return model


def accuracy(model: torch.nn.Module, X: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.from_numpy(X)).argmax(1).numpy() == y).mean())


def group_bound(epsilon: float, m: int) -> tuple[float, float]:
    """(m·ε, m·e^{(m−1)ε}·δ): what a row-level (ε, δ) guarantee says about m rows together."""
    return m * epsilon, min(1.0, m * math.exp(min(700.0, (m - 1) * epsilon)) * DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--persons", type=int, default=3000)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=200, help="expected batch: rows per row, persons per person")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="dp-sgd")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X, y, codes = heavy_tailed_table(args.persons, rng)
    X_test, y_test, _ = heavy_tailed_table(args.persons, np.random.default_rng(1))
    counts = np.bincount(codes)
    print(f"{args.persons} persons, {X.shape[0]} rows; rows per person: median {int(np.median(counts))}, "
          f"99th percentile {int(np.percentile(counts, 99))}, max {int(counts.max())}")  # fmt: skip
    results: dict[str, list[float]] = {"per row": [], "per person": []}
    for seed in range(args.seeds):
        for name, unit_codes in (("per row", None), ("per person", codes)):
            model = train(
                X,
                y,
                unit_codes,
                algorithm=args.algorithm,
                epsilon=args.epsilon,
                batch=args.batch,
                epochs=args.epochs,
                seed=seed,
            )
            results[name].append(accuracy(model, X_test, y_test))
    print(
        f"\n{args.algorithm}, logistic regression, target ε {args.epsilon:g} at δ {DELTA:g}, {args.epochs} epochs, "
        f"B {args.batch}"
    )
    print("| run | test accuracy (mean ± sd) | guarantee for a person with 1 / 10 / 100 / max rows |")
    print("|---|---|---|")
    for name, values in results.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        if name == "per person":
            guarantee = f"ε = {args.epsilon:g} for every person, however many rows"
        else:
            parts = []
            for m in (1, 10, 100, int(counts.max())):
                eps, delta = group_bound(args.epsilon, m)
                parts.append(f"m={m}: ε {eps:g}, δ {delta:.2g}" if delta < 1 else f"m={m}: none (δ' ≥ 1)")
            guarantee = "; ".join(parts)
        print(f"| {name} | {statistics.mean(values):.3f} ± {spread:.3f} | {guarantee} |")


if __name__ == "__main__":
    main()
