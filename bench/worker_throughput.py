"""Examples per second of a whole DP-SGD job through the service, against a plain Opacus loop.

Why: a GPU worker must be worth its price. This measures, in one run on one machine, the same
model at the same batch size trained two ways:

- **service**: a DP-SGD job submitted through `privtrain.Client` to a running server and trained
  by its Celery worker (upload → a 2-step warm-up job → the timed job → its report). Two figures:
  the report's `execution` throughput (the training loop alone, counted with the expected batch
  size) and the whole job's (steps × batch / the worker's started → finished time, which adds
  loading, the model file and the report);
- **engine**: the same trainer (``train_dp_sgd``, secure noise) called in this process on the
  same number of rows held on the device as a worker holds them, in the chunks a worker with this
  process's settings (``PRIVTRAIN_*``) takes on this device: what the worker's loop could reach.
  The service's loop ÷ this is the "whole job ≥ 90% of the engine" goal;
- **opacus**: a plain Opacus loop (`PrivacyEngine.make_private`, Poisson sampling, the same σ, C
  and learning rate) on the same images held as a CPU `TensorDataset`, as its tutorials train,
  timed from its first to its last step.

The images are random uint8 pixels (only sizes matter for speed), uploaded as an NPZ.

    PRIVTRAIN_URL=http://127.0.0.1:8000 PRIVTRAIN_API_KEY=... \\
        .venv/bin/python -m bench.worker_throughput --model wrn --params '{"depth": 16, "width": 4}' \\
        --rows 50000 --batch 1024 --steps 30
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from privtrain import Client
from privtrain.errors import AlreadyRegistered
from privtrain.resources import Dataset
from privtrain_common.zoo.architectures import build_model


def images(rows: int, size: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(rows, size, size, 3), dtype=np.uint8), rng.integers(0, classes, size=rows)


def npz_bytes(X: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y)
    return buffer.getvalue()


def through_the_service(client: Client, args: argparse.Namespace, X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    try:
        dataset_id = client.upload_dataset(
            npz_bytes(X, y), name="throughput", format="npz", epsilon=100.0, delta=1e-5, task="classification"
        ).id
    except AlreadyRegistered as registered:  # a rerun on the same server: the same images
        if registered.existing_dataset_id is None:
            raise
        dataset_id = registered.existing_dataset_id
    spec = {
        "dataset_id": dataset_id,
        "model": {"name": args.model, "params": args.params},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"noise_multiplier": args.sigma},
        "training": {"steps": args.steps, "batch_size": args.batch, "learning_rate": args.lr},
    }
    if args.precision != "fp32":
        spec["training"]["precision"] = args.precision
    warm_up = {**spec, "training": {**spec["training"], "steps": 2}}  # a fresh worker's first job pays
    client.wait(client.submit(warm_up).id, progress=False, poll_interval=1.0)  # one-off costs: not timed
    job = client.wait(client.submit(spec).id, progress=False, poll_interval=1.0)
    if job.status != "succeeded" or job.started_at is None or job.finished_at is None:
        raise RuntimeError(f"job {job.id} ended {job.status} ({job.error_code})")
    execution = client.get_report(job.id)["execution"]
    whole = (job.finished_at - job.started_at).total_seconds()
    return {
        "device": execution["device"],
        "loop_examples_per_second": execution["examples_per_second"],
        "job_examples_per_second": args.steps * args.batch / whole,
        "job_seconds": whole,
        "dataset": client.get_dataset(dataset_id),
    }


def in_process(args: argparse.Namespace, dataset: Dataset, y: np.ndarray, device: torch.device) -> dict[str, Any]:
    """The worker's DP-SGD trainer without the worker: rows on the device, the worker's chunks."""
    from dp.data.rows import TensorRows
    from dp.loop.batch_loop import DPSGDConfig, per_sample_map_aggregator, train_dp_sgd
    from dp.per_example.per_sample import AbadiClip
    from dp.randomness.secure_random import SecureRandom
    from kernel.config import Settings
    from kernel.datasets.facts import DatasetFacts
    from worker.train import rows_per_chunk

    shape = tuple(dataset.feature_shape)
    facts = DatasetFacts(n_rows=dataset.n_rows, feature_shape=shape, task=dataset.task, n_classes=dataset.n_classes)
    chunk = rows_per_chunk(Settings(), model_name=args.model, params=args.params, facts=facts, device=device)
    pixels = torch.rand((dataset.n_rows, *shape), generator=torch.Generator().manual_seed(0))
    features, labels = TensorRows(pixels, device=device), torch.from_numpy(y).to(device)
    model = build_model(
        args.model, args.params, input_shape=shape, n_outputs=args.classes, generator=torch.Generator().manual_seed(0)
    ).to(device)
    aggregator = per_sample_map_aggregator(model, AbadiClip(1.0), precision=args.precision)

    def train(steps: int) -> float:
        config = DPSGDConfig(
            steps=steps,
            sampling_probability=args.batch / dataset.n_rows,
            noise_multiplier=args.sigma,
            clipping_norm=1.0,
            learning_rate=args.lr,
            max_physical_batch_size=chunk,
            expected_batch_size=float(args.batch),
        )
        generator = SecureRandom.from_os_entropy(device, secure_gaussian=True)
        started = time.perf_counter()
        train_dp_sgd(model, features, labels, config=config, generator=generator, device=device, aggregator=aggregator)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    train(2)  # one-off costs, as the service's warm-up job
    seconds = train(args.steps)
    return {"loop_examples_per_second": args.steps * args.batch / seconds, "chunk": chunk}


def with_opacus(args: argparse.Namespace, X: np.ndarray, y: np.ndarray, device: torch.device) -> dict[str, Any]:
    from opacus import PrivacyEngine

    features = torch.from_numpy(X).permute(0, 3, 1, 2).float().div_(255.0)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features, torch.from_numpy(y)), batch_size=args.batch, shuffle=True
    )
    model = build_model(
        args.model, args.params, input_shape=tuple(features.shape[1:]), n_outputs=args.classes,
        generator=torch.Generator().manual_seed(0),
    ).to(device)  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer, loader = PrivacyEngine().make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=args.sigma,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )
    criterion = nn.CrossEntropyLoss()
    steps = 0
    started = 0.0
    while steps < args.steps + 1:
        for xb, yb in loader:
            if steps == 1:  # the first step pays one-off costs (kernels, allocator): not timed
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            criterion(model(xb.to(device, non_blocking=True)), yb.to(device)).backward()
            optimizer.step()
            steps += 1
            if steps == args.steps + 1:
                break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return {"loop_examples_per_second": args.steps * args.batch / seconds, "loop_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="wrn")
    parser.add_argument("--params", type=json.loads, default={"depth": 16, "width": 4})
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    X, y = images(args.rows, args.size, args.classes)
    service = through_the_service(Client.from_env(timeout=600), args, X, y)
    engine = in_process(args, service["dataset"], y, torch.device(args.device))
    opacus = with_opacus(args, X, y, torch.device(args.device))
    print(f"# {time.strftime('%Y-%m-%d')} · {service['device']} · torch {torch.__version__} · {platform.machine()}")
    print(f"# {args.model} {json.dumps(args.params)} on {args.rows} images {args.size}×{args.size}×3")
    print(f"# expected batch {args.batch}, {args.steps} steps, σ {args.sigma}, C 1, {args.precision}")
    print("| how | examples/s | × Opacus loop | × engine |")
    print("|---|---:|---:|---:|")
    reference, ideal = opacus["loop_examples_per_second"], engine["loop_examples_per_second"]
    rows = [
        ("Opacus loop (make_private, Poisson)", reference),
        (f"engine: train_dp_sgd in process, chunks of {engine['chunk']}", ideal),
        ("service: training loop (report's execution)", service["loop_examples_per_second"]),
        ("service: whole job, started → finished", service["job_examples_per_second"]),
    ]
    for how, rate in rows:
        print(f"| {how} | {rate:,.0f} | {rate / reference:.2f} | {rate / ideal:.2f} |")


if __name__ == "__main__":
    main()
