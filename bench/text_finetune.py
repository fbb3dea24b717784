"""Public pretraining, then DP fine-tuning (full and LoRA) of text transformers, through the API.

Why: DP fine-tuning of a pretrained transformer is how private text models get close to
non-private quality. This measures whether that holds for the service's own flow
(docs/text.md), on real text that ships offline (bench/text_corpora.py), against a running
server and only through `privtrain.Client`:

- classification (`transformer-classifier`, 3 classes: licence texts, Vim help, Python
  docstrings): adam pretraining on the PUBLIC split, then dp-sgd on the PRIVATE split at each ε —
  fine-tuning everything, fine-tuning LoRA adapters, and from scratch — next to a non-private
  reference (adam on the private rows uploaded again as a public dataset, clearly labelled);
  scored by accuracy on the TEST split;
- language modelling (`transformer-lm`): adam pretraining on Python docstrings (PUBLIC), then the
  same four settings on Vim help paragraphs (PRIVATE); scored by the perplexity of held-out Vim
  paragraphs (mean over rows of each row's mean token loss, exponentiated).

``--family hf`` runs the same protocol on Hugging Face Transformers models of the same sizes (a
BERT classifier, a GPT-2 language model; LoRA through PEFT, docs/hugging-face.md).

Every dataset uses the built-in byte tokenizer and `--max-length`. One job per cell; the same
hyperparameters at every ε. Scoring runs here, on the downloaded models.

    PRIVTRAIN_URL=http://127.0.0.1:8000 PRIVTRAIN_API_KEY=... \\
        .venv/bin/python -m bench.text_finetune --data /tmp/text --out /tmp/text-runs
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from kernel.tokenizers.byte import PAD_ID, ByteTokenizer
from privtrain import Client
from privtrain.errors import AlreadyRegistered
from privtrain.specs import build_job_spec
from privtrain_common.model_files import load_model

DELTA = 1e-5
IGNORED = -100


@dataclass(frozen=True)
class Row:
    task: str
    setting: str
    epsilon: float | None
    steps: int
    wall_s: float
    score: float | None
    job_id: str


def read_jsonl(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return records[:limit] if limit is not None else records


def write_jsonl(path: Path, records: list[dict[str, Any]], *, compact: bool = False) -> Path:
    """``compact``: other bytes for the same records (the non-private reference re-uploads the
    private rows as a public dataset, which the service would refuse as the same bytes)."""
    separators = (",", ":") if compact else (", ", ": ")
    lines = (json.dumps(r, ensure_ascii=False, separators=separators) + "\n" for r in records)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def tokens(texts: list[str], max_length: int) -> torch.Tensor:
    """The byte tokenizer's ids, truncated and right-padded exactly as the service stores them."""
    out = torch.full((len(texts), max_length), PAD_ID, dtype=torch.int64)
    for i, ids in enumerate(ByteTokenizer().encode_batch(texts)):
        ids = ids[:max_length]
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


@torch.no_grad()
def accuracy(model_path: Path, records: list[dict[str, Any]], max_length: int) -> float:
    loaded = load_model(model_path)
    assert loaded.classes is not None
    predicted = loaded.model(tokens([r["text"] for r in records], max_length)).argmax(dim=1)
    truth = torch.tensor([loaded.classes.index(r["label"]) for r in records])
    return float((predicted == truth).float().mean())


@torch.no_grad()
def perplexity(model_path: Path, records: list[dict[str, Any]], max_length: int) -> float:
    """exp of the mean over rows of each row's mean next-token loss (padding ignored)."""
    loaded = load_model(model_path)
    ids = tokens([r["text"] for r in records], max_length)
    row_means = []
    for chunk in ids.split(64):
        logits = loaded.model(chunk)[:, :-1]
        targets = chunk[:, 1:].masked_fill(chunk[:, 1:] == PAD_ID, IGNORED)
        losses = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=IGNORED, reduction="none")
        counts = (targets != IGNORED).sum(dim=1).clamp(min=1)
        row_means.append(losses.sum(dim=1) / counts)
    return math.exp(float(torch.cat(row_means).mean()))


def evaluate(model_path: Path, data: Path, *, test_rows: int) -> str:
    """One model's score on the test split of its task (read from the model's config)."""
    config = load_model(model_path).config
    text = config["text"]
    assert isinstance(text, dict)
    max_length = int(text["max_length"])
    if config["task"] == "classification":
        test = read_jsonl(data / "cls_test.jsonl")
        return f"test accuracy {accuracy(model_path, test, max_length):.4f} on {len(test)} held-out paragraphs"
    test = read_jsonl(data / "lm_test.jsonl", test_rows)
    return f"test perplexity per byte {perplexity(model_path, test, max_length):.3f} on {len(test)} held-out paragraphs"


class Runner:
    """Submits, waits, downloads and scores; prints each row as it finishes."""

    def __init__(self, client: Client, out: Path) -> None:
        self.client, self.out = client, out
        self.rows: list[Row] = []

    def run(self, task: str, setting: str, epsilon: float | None, spec: dict[str, Any], score: Any) -> Row:
        job = self.client.wait(self.client.submit(spec).id, progress=False, poll_interval=1.0)
        if job.status != "succeeded" or job.started_at is None or job.finished_at is None:
            raise RuntimeError(f"{task} {setting} at ε={epsilon}: job {job.id} ended {job.status} ({job.error_code})")
        model_path = self.client.download_model(job.id, self.out)
        row = Row(
            task=task,
            setting=setting,
            epsilon=epsilon,
            steps=job.steps_run,
            wall_s=(job.finished_at - job.started_at).total_seconds(),
            score=score(model_path) if score is not None else None,
            job_id=job.id,
        )
        shown = "-" if row.score is None else f"{row.score:.4f}"
        eps = "-" if epsilon is None else f"{epsilon:g}"
        print(
            f"{task:14s} {setting:26s} ε={eps:>3s} steps={row.steps:4d} wall={row.wall_s:6.1f}s score={shown}",
            flush=True,
        )
        self.rows.append(row)
        return row


def hf_params(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The `hf` model of the zoo model's sizes: a BERT classifier, or a GPT-2 language model (the
    vocabulary and padding are the dataset's byte tokenizer's, filled in by the service)."""
    if model == "transformer-classifier":
        config = {
            "model_type": "bert",
            "hidden_size": args.dim,
            "num_hidden_layers": args.layers,
            "num_attention_heads": 4,
            "intermediate_size": 2 * args.dim,
            "max_position_embeddings": args.max_length,
        }
        return {"task": "sequence-classification", "config": config}
    config = {
        "model_type": "gpt2",
        "n_embd": args.dim,
        "n_layer": args.layers,
        "n_head": 4,
        "n_inner": 2 * args.dim,
        "n_positions": args.max_length,
    }
    return {"task": "causal-lm", "config": config}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the folder bench/text_corpora.py wrote")
    parser.add_argument("--out", type=Path, default=Path("bench/out/text_finetune"))
    parser.add_argument("--tasks", nargs="+", default=["classification", "language-model"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 8.0])
    parser.add_argument("--max-length", type=int, default=96)
    parser.add_argument("--lm-rows", type=int, default=2000, help="private Vim paragraphs for the LM task")
    parser.add_argument("--lm-public-rows", type=int, default=2000)
    parser.add_argument("--test-rows", type=int, default=300)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--pretrain-epochs", type=float, default=4)
    parser.add_argument("--epochs", type=float, default=6)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the non-private reference (a service that matches uploads by their rows refuses the private "
        "rows again as a public dataset)",
    )
    parser.add_argument(
        "--family",
        choices=["zoo", "hf"],
        default="zoo",
        help="zoo: transformer-classifier and transformer-lm; hf: the same sizes as Transformers models (a BERT "
        "classifier, a GPT-2 language model; LoRA through PEFT)",
    )
    parser.add_argument("--budget-epsilon", type=float, default=40.0)
    parser.add_argument(
        "--evaluate", type=Path, metavar="MODEL", help="score one downloaded model on its task's test split and stop"
    )
    args = parser.parse_args()
    if args.evaluate is not None:
        print(evaluate(args.evaluate, args.data, test_rows=args.test_rows))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    client = Client.from_env(timeout=300)
    runner = Runner(client, args.out)
    started = time.time()
    zoo_params = {"layers": args.layers, "dim": args.dim, "heads": 4, "mlp_dim": 2 * args.dim}

    def upload(path: Path, *, public: bool) -> str:
        common: dict[str, Any] = {"tokenizer": "byte", "max_length": args.max_length}
        budget: dict[str, Any] = {"public": True} if public else {"epsilon": args.budget_epsilon, "delta": DELTA}
        try:
            return client.upload_dataset(path, **common, **budget).id
        except AlreadyRegistered as registered:  # a rerun against the same server: the same rows
            if registered.existing_dataset_id is None:
                raise
            return registered.existing_dataset_id

    def spec(model: str, dataset_id: str, *, epsilon: float | None, **options: Any) -> dict[str, Any]:
        private = epsilon is not None
        return build_job_spec(
            dataset_id=dataset_id,
            model="hf" if args.family == "hf" else model,
            model_params=hf_params(model, args) if args.family == "hf" else zoo_params,
            algorithm="dp-sgd" if private else "adam",
            hyperparameters={"clipping_norm": 1.0} if private else {},
            target_epsilon=epsilon,
            epochs=options.pop("epochs", args.epochs),
            batch_size=args.batch_size if private else 64,
            learning_rate=args.lr if private else 1e-3,
            **options,
        )

    for task in args.tasks:
        if task == "classification":
            model = "transformer-classifier"
            test = read_jsonl(args.data / "cls_test.jsonl")
            public = upload(args.data / "cls_public.jsonl", public=True)
            private_path = args.data / "cls_private.jsonl"

            def score(path: Path, test: list[dict[str, Any]] = test) -> float:
                return accuracy(path, test, args.max_length)
        else:
            model = "transformer-lm"
            test = read_jsonl(args.data / "lm_test.jsonl", args.test_rows)
            public_rows = read_jsonl(args.data / "lm_public.jsonl", args.lm_public_rows)
            public = upload(write_jsonl(args.out / "lm_public.jsonl", public_rows), public=True)
            private_path = write_jsonl(
                args.out / "lm_private.jsonl", read_jsonl(args.data / "lm_private.jsonl", args.lm_rows)
            )

            def score(path: Path, test: list[dict[str, Any]] = test) -> float:
                return perplexity(path, test, args.max_length)

        private = upload(private_path, public=False)
        pretrain = runner.run(
            task,
            "public pretraining (adam)",
            None,
            spec(model, public, epsilon=None, epochs=args.pretrain_epochs),
            None,
        )
        if not args.no_reference:
            copy = write_jsonl(args.out / f"{task}_reference.jsonl", read_jsonl(private_path), compact=True)
            reference = upload(copy, public=True)
            runner.run(task, "NON-PRIVATE reference (adam)", None, spec(model, reference, epsilon=None), score)
        for epsilon in args.epsilons:
            settings: dict[str, dict[str, Any]] = {
                "DP fine-tune full": {"init_job": pretrain.job_id, "finetune": "full"},
                "DP fine-tune LoRA": {"init_job": pretrain.job_id, "finetune": "lora", "lora_rank": args.lora_rank},
                "DP from scratch": {},
            }
            for setting, options in settings.items():
                runner.run(task, setting, epsilon, spec(model, private, epsilon=epsilon, **options), score)
    print("\n| task | setting | ε | steps | wall time (s) | score |\n|---|---|---|---|---|---|")
    for row in runner.rows:
        eps = "—" if row.epsilon is None else f"{row.epsilon:g}"
        shown = "—" if row.score is None else f"{row.score:.4f}"
        print(f"| {row.task} | {row.setting} | {eps} | {row.steps} | {row.wall_s:.1f} | {shown} |")
    print(f"total {time.time() - started:.0f} s")
    (args.out / "results.json").write_text(json.dumps([asdict(row) for row in runner.rows], indent=2))


if __name__ == "__main__":
    main()
