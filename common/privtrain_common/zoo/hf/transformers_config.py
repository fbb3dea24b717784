"""What Transformers is given for an `hf` model, and what a ``save_pretrained`` folder of it holds.

Torch-free and Transformers-free, so that the worker's builder and the service's ``format=hf``
download agree by construction: the builder passes :func:`transformers_settings` to
``AutoConfig.for_model``, and the download writes the same settings (plus the class name and the
dataset's labels) as ``config.json``, with the tensor names Transformers uses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from privtrain_common.zoo.hf.families import FAMILIES

WRAPPER_PREFIX = "model."
"""The released state dict holds the Transformers model under this attribute of the zoo's wrapper."""

_CLASS_STEMS = {
    "bert": "Bert",
    "roberta": "Roberta",
    "distilbert": "DistilBert",
    "gpt2": "GPT2",
    "llama": "Llama",
    "qwen2": "Qwen2",
    "vit": "ViT",
    "convnext": "ConvNext",
}
_TASK_CLASSES = {
    "sequence-classification": "ForSequenceClassification",
    "causal-lm": "ForCausalLM",
    "image-classification": "ForImageClassification",
}
_FLOAT_KEYS = ("layer_scale_init_value", "layer_norm_eps", "initializer_range")
AUTO_CLASSES = {
    "sequence-classification": "AutoModelForSequenceClassification",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}
"""Task → the Transformers auto class that builds (and loads) its model."""


def architecture(model_type: str, task: str) -> str:
    """The Transformers class an `hf` model of ``task`` is (GPT-2's language model keeps its old name)."""
    if model_type == "gpt2" and task == "causal-lm":
        return "GPT2LMHeadModel"
    return _CLASS_STEMS[model_type] + _TASK_CLASSES[task]


def transformers_settings(config: Mapping[str, Any], *, task: str, n_outputs: int) -> dict[str, Any]:
    """The job's config as Transformers gets it: every dropout 0 (per-example gradients need a
    deterministic forward), the LM head untied from the embedding (one parameter, one layer),
    begin/end token ids only when the config gives them, and a classifier's number of labels. Image
    models have no tokens: only their dropout (ConvNeXt's stochastic depth) is set."""
    family = FAMILIES[config["model_type"]]
    settings = dict(config)
    settings.update(dict.fromkeys(family.dropout_keys, 0.0))
    if not family.image:
        settings["tie_word_embeddings"] = False
        for token in ("bos_token_id", "eos_token_id"):  # never a family default outside the dataset's vocabulary
            settings.setdefault(token, None)
    for key in _FLOAT_KEYS:  # JSON writes 0.0 as 0; Transformers' typed configs want a float
        if isinstance(settings.get(key), int) and not isinstance(settings[key], bool):
            settings[key] = float(settings[key])
    if "depths" in settings:  # ConvNeXt: Transformers' default is 4 stages, whatever the lists give
        settings.setdefault("num_stages", len(settings["depths"]))
    if task != "causal-lm":
        settings["num_labels"] = n_outputs
    return settings


def config_json(
    config: Mapping[str, Any], *, task: str, n_outputs: int, classes: Sequence[str] | None
) -> dict[str, Any]:
    """A ``config.json`` that ``AutoModelFor….from_pretrained`` reads into the model the job trained."""
    settings = transformers_settings(config, task=task, n_outputs=n_outputs)
    settings["architectures"] = [architecture(config["model_type"], task)]
    if task != "causal-lm" and classes is not None and len(classes) == n_outputs:
        settings["id2label"] = {str(index): label for index, label in enumerate(classes)}
        settings["label2id"] = {label: index for index, label in enumerate(classes)}
    return settings


_SAVED_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "vit": (
        (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
        (r"\.attention\.q_proj\.", ".attention.attention.query."),
        (r"\.attention\.k_proj\.", ".attention.attention.key."),
        (r"\.attention\.v_proj\.", ".attention.attention.value."),
        (r"\.attention\.o_proj\.", ".attention.output.dense."),
        (r"\.mlp\.fc1\.", ".intermediate.dense."),
        (r"\.mlp\.fc2\.", ".output.dense."),
    ),
}
"""model_type → (pattern, replacement) from a module's name to the one ``save_pretrained`` writes:
Transformers 5 renamed ViT's modules but still saves (and loads) the names of earlier versions."""


def saved_name(model_type: str, name: str) -> str:
    """A Transformers tensor name as ``save_pretrained`` writes it (the same name for most types)."""
    for pattern, replacement in _SAVED_NAMES.get(model_type, ()):
        name = re.sub(pattern, replacement, name)
    return name


def transformers_name(name: str) -> str:
    """A released tensor's name as Transformers names it (the wrapper's prefix dropped)."""
    if not name.startswith(WRAPPER_PREFIX):
        raise ValueError(f"tensor {name!r} is not part of the wrapped Transformers model")
    return name[len(WRAPPER_PREFIX) :]
