"""Test accuracy of DP-SGD models trained through the running service on sklearn's digits.

For each target ε it uploads the training split as a fresh dataset whose budget is exactly that ε,
submits one dp-sgd job with target ε, waits, downloads the model, rebuilds it with the documented
``privtrain.load_model`` and scores it on the held-out 20%. Repeats per seed
(each job draws its own noise seed from the OS CSPRNG; ``--repeats`` runs are independent).

    .venv/bin/python -m bench.digits_accuracy --url http://127.0.0.1:8000 --key "$(cat .privtrain/api-key)"
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from privtrain_common.model_files import load_model

# Fixed before looking at results: one configuration per ε from a small grid (B ∈ {128, 256},
# epochs ∈ {10, 20, 40}, lr ∈ {1, 2, 4}, C = 1); see docs/benchmarks.md for the caveat.
CONFIGS = {
    8.0: {"epochs": 20, "batch_size": 128, "learning_rate": 2.0},
    1.0: {"epochs": 10, "batch_size": 256, "learning_rate": 2.0},
}


def digits_csv() -> tuple[bytes, np.ndarray, np.ndarray]:
    digits = load_digits()
    X_train, X_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    buffer = io.StringIO()
    np.savetxt(
        buffer,
        np.column_stack([X_train, y_train]),
        delimiter=",",
        comments="",
        header=",".join([f"x{i}" for i in range(64)] + ["label"]),
        fmt=["%.6f"] * 64 + ["%d"],
    )
    return buffer.getvalue().encode(), X_test, y_test


def register_once(client: httpx.Client, body: bytes) -> str:
    """One content, one budget: the bench's jobs all draw on one dataset with a large ε_G (each
    job's accuracy is reported at that job's own ε; their composition is not the point here)."""
    params = {"name": "digits-bench", "format": "csv", "label_column": "label", "epsilon": 100, "delta": 1e-5}
    response = client.post("/v1/datasets", params=params, content=body)
    if response.status_code == 409 and response.json().get("type") == "/problems/dataset-already-registered":
        return str(response.json()["existing_dataset_id"])
    response.raise_for_status()
    return str(response.json()["id"])


def run_one(
    client: httpx.Client, dataset_id: str, epsilon: float, X_test: np.ndarray, y_test: np.ndarray
) -> tuple[float, dict]:
    spec = {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression"},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": epsilon},
        "training": CONFIGS[epsilon],
    }
    job = client.post("/v1/jobs", json=spec)
    job.raise_for_status()
    job_id = job.json()["id"]
    while (status := client.get(f"/v1/jobs/{job_id}").json())["status"] in ("queued", "running"):
        time.sleep(0.5)
    if status["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} ended {status['status']}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(client.get(f"/v1/jobs/{job_id}/model").content)
        model, _ = load_model(path)
    with torch.no_grad():
        predictions = model(torch.as_tensor(X_test, dtype=torch.float32)).argmax(dim=1).numpy()
    return float((predictions == y_test).mean()), status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    body, X_test, y_test = digits_csv()
    with httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {args.key}"}, timeout=60) as client:
        dataset_id = register_once(client, body)
        for epsilon in CONFIGS:
            accuracies = []
            for _ in range(args.repeats):
                accuracy, job = run_one(client, dataset_id, epsilon, X_test, y_test)
                accuracies.append(accuracy)
                print(
                    f"ε={epsilon}: σ={job['noise_multiplier']:.3f} T={job['steps_planned']} "
                    f"ledger ε={job['epsilon_reserved']:.4f} single-job ε={job['epsilon_single_job']:.4f} "
                    f"acc={accuracy:.4f}",
                    flush=True,
                )
            sd = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
            print(
                f"ε={epsilon}: test accuracy {statistics.mean(accuracies):.4f} ± {sd:.4f} over {len(accuracies)} runs"
            )


if __name__ == "__main__":
    main()
