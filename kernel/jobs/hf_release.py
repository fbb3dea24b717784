"""A released `hf` model as a Transformers ``save_pretrained`` folder, zipped, without torch.

``GET /v1/jobs/{id}/model?format=hf`` answers with it: ``config.json`` and ``model.safetensors``,
which ``AutoModelForSequenceClassification.from_pretrained(folder)`` (or ``…ForCausalLM``,
``…ForImageClassification``) loads
into the model the job trained, ``privacy_report.json`` (the report as the caller may read it)
and ``README.md``, a model card that states the guarantee in words.

The weights are the released file's own bytes: only the safetensors header is rewritten (the
tensor names lose the zoo wrapper's ``model.`` prefix, the metadata becomes Transformers'
``{"format": "pt"}``), the tensor data is copied as it is. The config is the one the worker built
the model from (``privtrain_common.zoo.hf.transformers_config``), so the two cannot disagree.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from kernel.errors import InvalidInput
from kernel.jobs.released_tensors import released_config, write_renamed
from privtrain_common.model_format import ADAPTER_PREFIX
from privtrain_common.zoo.hf.transformers_config import (
    AUTO_CLASSES,
    architecture,
    config_json,
    saved_name,
    transformers_name,
)

HF_FORMAT = "hf"


class ModelFormatUnavailable(InvalidInput):
    """The job's model has no representation in the asked format (``format=hf`` of a zoo model)."""

    def __init__(self, *, model: str, format: str) -> None:
        super().__init__(
            slug="model-format-unavailable",
            detail=f"format={format} is for models named 'hf' (Transformers models); this job's model is {model!r}: "
            "download it without format (safetensors, for privtrain.load_model)",
            extra={"model": model, "format": format},
        )


def _transformers_name(name: str, *, model_type: str) -> str | None:
    """Transformers' name of a released tensor as ``save_pretrained`` writes it (ViT's earlier module
    names, which every Transformers version loads); None for a PEFT adapter's tensors."""
    if name.startswith(ADAPTER_PREFIX):
        return None
    return saved_name(model_type, transformers_name(name))


def _write_weights(model_path: Path, target: IO[bytes], *, model_type: str) -> None:
    write_renamed(
        model_path,
        target,
        rename=lambda name: _transformers_name(name, model_type=model_type),
        metadata={"format": "pt"},
    )


def model_card(config: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """README.md: what the model is, how to load it, and its privacy guarantee in words."""
    params = config["model"]["params"]
    task, hf = params["task"], params["config"]
    name = architecture(hf["model_type"], task)
    auto = AUTO_CLASSES[task]
    guarantee = report.get("guarantee") or "see privacy_report.json"
    text = config.get("text") or {}
    return "\n".join(
        [
            f"# {name}, trained with differential privacy by privtrain",
            "",
            f"Job `{config.get('job_id', report.get('job_id', ''))}`: a `{hf['model_type']}` model ({task}), "
            f"{start_sentence(config, report)}",
            "",
            "## Privacy guarantee",
            "",
            str(guarantee),
            "",
            "The full privacy report (mechanism, accountant, ledger) is `privacy_report.json` in this folder.",
            "",
            "## Loading",
            "",
            "```python",
            f"from transformers import {auto}",
            "",
            f'model = {auto}.from_pretrained("path/to/this/folder")',
            "```",
            "",
            _inputs(hf, config, text),
            "Dropout is 0 in this config: training used none, so that per-example gradients were exact.",
            "",
        ]
    )


def start_sentence(config: Mapping[str, Any], report: Mapping[str, Any]) -> str:
    """How the weights started and what trained, in words (as the report states the start)."""
    init = report.get("init") if isinstance(report.get("init"), Mapping) else None
    if init is None:
        start = "trained from a random initialisation"
    elif init.get("kind") == "base-model":
        uploaded = init.get("archive_sha256") or init.get("sha256")
        start = f"fine-tuned from base model `{init.get('base_model_id')}` (uploaded with SHA-256 `{uploaded}`)"
    else:
        start = f"fine-tuned from the model of job `{init.get('job_id')}`"
    lora = config.get("lora")
    how = (
        f" with LoRA adapters (rank {lora['rank']}, alpha {lora['alpha']:g}), merged into these weights"
        if isinstance(lora, Mapping)
        else ""
    )
    return f"{start}{how}, with differentially private training."


def _inputs(hf: Mapping[str, Any], config: Mapping[str, Any], text: Mapping[str, Any]) -> str:
    """What the model takes: token ids of the dataset's tokenizer, or float images (C, H, W)."""
    if "vocab_size" not in hf:
        shape = " × ".join(str(side) for side in config["input_shape"])
        return (
            f"Inputs are `pixel_values`: float images of shape (batch, {shape}), channels first, as the job's "
            "dataset fed them (no image processor was used: normalise as that dataset was)."
        )
    return (
        f"Inputs are the token ids of the dataset's tokenizer (`{text.get('tokenizer_id', 'see the job')}`, "
        f"vocabulary {hf['vocab_size']}, padding id {hf['pad_token_id']}, rows of up to "
        f"{config['input_shape'][0]} tokens); pass `attention_mask` = 1 for real tokens, 0 for padding."
    )


def write_hf_zip(model_path: Path, *, report: Mapping[str, Any], destination: IO[bytes]) -> None:
    """The ``save_pretrained`` folder of the released model at ``model_path``, as a ZIP, to
    ``destination``; ``report`` is the privacy report as the caller may read it."""
    config = released_config(model_path)
    model = config.get("model", {})
    if model.get("name") != "hf":
        raise ModelFormatUnavailable(model=str(model.get("name")), format=HF_FORMAT)
    params = model["params"]
    settings = config_json(
        params["config"], task=params["task"], n_outputs=config["n_outputs"], classes=config.get("classes")
    )
    with zipfile.ZipFile(destination, "w") as archive:
        archive.writestr("config.json", json.dumps(settings, indent=2, sort_keys=True), zipfile.ZIP_DEFLATED)
        with archive.open(zipfile.ZipInfo("model.safetensors"), "w", force_zip64=True) as weights:
            _write_weights(model_path, weights, model_type=str(params["config"]["model_type"]))
        archive.writestr("privacy_report.json", json.dumps(report, indent=2, sort_keys=True), zipfile.ZIP_DEFLATED)
        archive.writestr("README.md", model_card(config, report), zipfile.ZIP_DEFLATED)
