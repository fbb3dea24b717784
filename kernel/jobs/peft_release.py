"""A LoRA job's PEFT adapter, zipped, without torch (``GET /v1/jobs/{id}/model?format=peft``).

An `hf` model fine-tuned with LoRA is released merged, and its file also carries the adapter as PEFT
saves it (``privtrain_common.model_format.ADAPTER_PREFIX``; training/peft_lora.py). This download
is the folder ``PeftModel.from_pretrained(base, folder)`` loads onto the base model the job
started from: ``adapter_config.json`` (PEFT's own config, recorded by the worker),
``adapter_model.safetensors`` (the adapter's tensors, copied as they are), ``privacy_report.json``
and ``README.md``, whose model card names the base model, its hash, and the guarantee in words.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from kernel.errors import InvalidInput
from kernel.jobs.hf_release import start_sentence
from kernel.jobs.released_tensors import released_config, write_renamed
from privtrain_common.model_format import ADAPTER_PREFIX
from privtrain_common.zoo.hf.transformers_config import AUTO_CLASSES

__all__ = ["PEFT_FORMAT", "write_peft_zip"]

PEFT_FORMAT = "peft"


class NoAdapter(InvalidInput):
    """``format=peft`` of a model that was not fine-tuned with LoRA on an `hf` model."""

    def __init__(self, *, model: str) -> None:
        super().__init__(
            slug="model-format-unavailable",
            detail="format=peft is the LoRA adapter of an 'hf' model fine-tuned with training.finetune lora; this "
            "job's model has none: download it with format=hf (an 'hf' model) or without format "
            "(privtrain.load_model)",
            extra={"model": model, "format": PEFT_FORMAT},
        )


def _adapter_name(name: str) -> str | None:
    return name[len(ADAPTER_PREFIX) :] if name.startswith(ADAPTER_PREFIX) else None


def adapter_card(config: Mapping[str, Any], report: Mapping[str, Any], adapter: Mapping[str, Any]) -> str:
    """README.md: what the adapter is, the base it goes on, how to load it, and the guarantee."""
    params = config["model"]["params"]
    task = params["task"]
    auto = AUTO_CLASSES[task]
    given = report.get("init")
    init: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    base = init.get("base_model_id") or init.get("job_id") or "the model the job started from"
    guarantee = report.get("guarantee") or "see privacy_report.json"
    targets = ", ".join(adapter.get("target_modules") or [])
    return "\n".join(
        [
            f"# LoRA adapter for a `{params['config']['model_type']}` model, trained with differential privacy by "
            "privtrain",
            "",
            f"Job `{config.get('job_id', report.get('job_id', ''))}` ({task}): {start_sentence(config, report)}",
            f"The adapters sit on {targets} (rank {adapter.get('r')}, alpha {adapter.get('lora_alpha')})"
            + (
                f"; the head ({', '.join(adapter['modules_to_save'])}) trained too."
                if adapter.get("modules_to_save")
                else "."
            ),
            "",
            "## Privacy guarantee",
            "",
            str(guarantee),
            "",
            "The full privacy report is `privacy_report.json` in this folder. The base model's weights are treated "
            "as public: the guarantee covers the data this job trained on, nothing about the base model's data.",
            "",
            "## Loading",
            "",
            f"The adapter goes on the base model `{base}` (the ZIP you uploaded; its SHA-256 is in the report's "
            "`init` section). Unzip that checkpoint and:",
            "",
            "```python",
            "from peft import PeftModel",
            f"from transformers import {auto}",
            "",
            f'base = {auto}.from_pretrained("path/to/the/base/checkpoint"'
            + (f", num_labels={config['n_outputs']}" if task != "causal-lm" else "")
            + ")",
            'model = PeftModel.from_pretrained(base, "path/to/this/folder")',
            "```",
            "",
            "`format=hf` downloads the same model with the adapters merged into the weights.",
            "",
        ]
    )


def write_peft_zip(model_path: Path, *, report: Mapping[str, Any], destination: IO[bytes]) -> None:
    """The PEFT adapter folder of the released model at ``model_path``, as a ZIP, to ``destination``;
    ``report`` is the privacy report as the caller may read it. NoAdapter when it has none."""
    config = released_config(model_path)
    model = config.get("model", {})
    lora = config.get("lora")
    adapter = lora.get("adapter_config") if isinstance(lora, Mapping) else None
    if model.get("name") != "hf" or not isinstance(adapter, Mapping):
        raise NoAdapter(model=str(model.get("name")))
    with zipfile.ZipFile(destination, "w") as archive:
        archive.writestr("adapter_config.json", json.dumps(adapter, indent=2, sort_keys=True), zipfile.ZIP_DEFLATED)
        with archive.open(zipfile.ZipInfo("adapter_model.safetensors"), "w", force_zip64=True) as weights:
            write_renamed(model_path, weights, rename=_adapter_name, metadata={"format": "pt"})
        archive.writestr("privacy_report.json", json.dumps(report, indent=2, sort_keys=True), zipfile.ZIP_DEFLATED)
        archive.writestr("README.md", adapter_card(config, report, adapter), zipfile.ZIP_DEFLATED)
