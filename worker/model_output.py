"""The released model file: safetensors weights with the config a client needs to use them
(architecture, inputs, outputs, preparation, tokenizer), written to a temporary file that the
settlement stores. Only public choices go into its config, never a private value."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from kernel.schemas.jobs import LoraSpec
from privtrain_common.model_files import save_model
from training.lora import merge_lora
from training.peft_lora import PeftAdapter, release_adapter
from worker.claim import Claimed
from worker.context import WorkerContext

__all__ = ["write_model"]


def write_model(
    ctx: WorkerContext, *, claimed: Claimed, model: torch.nn.Module, class_names: tuple[str, ...] | None
) -> Path:
    """``model`` (moved to the CPU) with its config; ``class_names``: the public class list."""
    job, dataset = claimed.job, claimed.dataset
    lora = claimed.training.lora
    adapter = release_adapter(model)  # an hf model's PEFT adapter, then merged into its weights
    merged = merge_lora(model) or adapter is not None  # released as W + (alpha/r)·B·A in the plain architecture
    ctx.tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=ctx.tmp_dir, suffix=".safetensors")
    os.close(fd)
    path = Path(name)
    save_model(
        path,
        model.to("cpu"),
        config={
            "format_version": 1,
            "model": {"name": job.model_name, "params": claimed.spec.model.params},
            "input_shape": list(dataset.feature_shape),
            "n_outputs": claimed.n_outputs,
            "task": dataset.task,
            "job_id": job.id,
            "dataset_id": dataset.id,
            "feature_names": dataset.feature_names,
            # Output i is classes[i]; the features were prepared as declared before training.
            "classes": list(class_names) if class_names is not None else None,
            "preparation": dataset.preparation,
            # A text model's inputs: token ids from this public tokenizer, padded to max_length.
            "text": (
                {
                    "tokenizer_id": dataset.tokenizer_id,
                    "vocab_size": dataset.vocab_size,
                    "pad_id": dataset.pad_id,
                    "max_length": dataset.feature_shape[0],
                }
                if dataset.modality == "text"
                else None
            ),
            # The released weights: the last iterate, or their moving average (post-processing).
            "ema_decay": claimed.training.ema_decay,
            # How it trained (public choices): augmented views per example, arithmetic.
            "augmult": claimed.training.augmult,
            "precision": claimed.training.precision or "fp32",
            # LoRA fine-tuning: the adapters' rank and alpha; the weights hold them merged.
            "lora": _lora_record(lora, adapter) if lora is not None and merged else None,
        },
        adapter=adapter.tensors if adapter is not None else None,
    )
    return path


def _lora_record(lora: LoraSpec, adapter: PeftAdapter | None) -> dict[str, object]:
    """The config's ``lora``: rank and alpha (the weights hold the adapters merged); for an `hf`
    model also PEFT's ``adapter_config.json`` contents, whose tensors the file carries too."""
    record: dict[str, object] = {"rank": lora.rank, "alpha": lora.alpha, "merged": True}
    if adapter is not None:
        record["adapter_config"] = adapter.config
    return record
