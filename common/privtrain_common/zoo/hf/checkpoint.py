"""A ``save_pretrained`` checkpoint's ``config.json`` read into the `hf` model's params.

Runs in the capped child process that checks base-model uploads (``parameter_shapes``), which
may import Transformers; nothing here is ever executed from the upload (no ``auto_map``, no
remote code): the config is JSON, read as data. A real config holds more than the job's `hf`
params accept: bookkeeping (``architectures``, ``transformers_version``, ``id2label``…), dropout
rates (always 0 here: per-example gradients need a deterministic forward), and settings left at
their default. Those are dropped. Any other key, one that would change what the model computes
and the `hf` builder does not take, is refused by name, so the model trained is the model
uploaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from privtrain_common.zoo.hf.definition import HFParams, family_of
from privtrain_common.zoo.hf.families import HFFamily

BOOKKEEPING_KEYS = frozenset(
    {
        "architectures",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "use_cache",
        "_name_or_path",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "tie_word_embeddings",
        "gradient_checkpointing",
        "_attn_implementation_autoset",
    }
)
"""Keys that say how the checkpoint was saved or labelled, not what the model computes (the head's
size comes from the tensors; tied LM heads are untied by copying the embedding)."""

_TASK_SUFFIXES = (
    ("ForSequenceClassification", "sequence-classification"),
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForImageClassification", "image-classification"),
)


class CheckpointRefused(ValueError):
    """The config cannot be trained as uploaded (the message says which key or why)."""


@dataclass(frozen=True)
class CheckpointModel:
    """What the upload is, as the `hf` model sees it."""

    task: str
    params: dict[str, Any]
    """``{"task", "config"}``: the `hf` params a job on these weights takes."""
    model_class: str
    """The Transformers class the checkpoint was saved from (``architectures[0]``), or the model type."""
    labels: int | None
    """A classifier's number of labels as the config states it (``id2label``/``num_labels``)."""
    tied_lm_head: bool
    """Whether a language model's head shares the token embedding's tensor (saved once)."""


def task_of(config: Mapping[str, Any], requested: str | None) -> str:
    """The asked task, or the one the saved class names (``…ForCausalLM`` → causal-lm)."""
    if requested is not None:
        return requested
    classes = config.get("architectures")
    name = classes[0] if isinstance(classes, list) and classes and isinstance(classes[0], str) else ""
    for suffix, task in _TASK_SUFFIXES:
        if name.endswith(suffix):
            return task
    raise CheckpointRefused(
        f"the checkpoint's class {name or '(none given)'} does not say the task; give task=sequence-classification, "
        "task=causal-lm or task=image-classification"
    )


def _derived(model_type: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """Every setting Transformers' config class holds for these settings: its defaults, and the
    values it derives from them (Llama's ``head_dim``, Qwen2's ``layer_types``…)."""
    import transformers  # the child process only: the API never imports it

    given = {key: value for key, value in settings.items() if key != "model_type"}
    derived: dict[str, Any] = transformers.AutoConfig.for_model(model_type, **given).to_dict()
    return derived


def _is_dropout(key: str) -> bool:
    return "dropout" in key or key.endswith("_pdrop")


def _default_rope(family: HFFamily, config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Transformers 5 saves RoPE as ``rope_parameters: {"rope_type", "rope_theta"}``; the default RoPE
    is read as the ``rope_theta`` key the `hf` model takes (any other RoPE stays, and is refused)."""
    rope = config.get("rope_parameters")
    if (
        "rope_theta" not in family.accepted_keys
        or not isinstance(rope, Mapping)
        or rope.get("rope_type", "default") != "default"
        or not set(rope) <= {"rope_type", "rope_theta"}
    ):
        return config
    unpacked = {key: value for key, value in config.items() if key != "rope_parameters"}
    if "rope_theta" in rope:
        unpacked["rope_theta"] = rope["rope_theta"]
    return unpacked


def kept_config(family: HFFamily, config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the `hf` builder takes; bookkeeping, dropout and settings at the value Transformers
    would give them anyway dropped; any other key refused by name."""
    config = _default_rope(family, config)
    kept = {key: value for key, value in config.items() if key in family.accepted_keys and value is not None}
    derived = _derived(family.model_type, kept)
    refused = sorted(
        key
        for key, value in config.items()
        if key not in family.accepted_keys  # accepted, or None: unset
        and key not in BOOKKEEPING_KEYS
        and not _is_dropout(key)
        and key not in family.dropout_keys
        and not (key in derived and derived[key] == value)
        and not (value is None and derived.get(key) is None)
    )
    if refused:
        raise CheckpointRefused(
            f"config keys {refused} change what a {family.model_type} model computes and are not supported "
            f"(supported: {', '.join(sorted(family.accepted_keys))}, each other key at Transformers' default)"
        )
    return kept


def _labels(config: Mapping[str, Any]) -> int | None:
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    labels = config.get("num_labels")
    return labels if isinstance(labels, int) and not isinstance(labels, bool) and labels > 0 else None


def read_checkpoint_config(config: object, *, task: str | None) -> CheckpointModel:
    """The `hf` params, class and head facts of a checkpoint's ``config.json`` (CheckpointRefused or
    ValueError naming what does not fit)."""
    family = family_of(config)  # an object, allow-listed model type, size-capped
    assert isinstance(config, dict)
    chosen = task_of(config, task)
    kept = kept_config(family, config)
    declared = HFParams(task=chosen, config=kept)  # type: ignore[arg-type]  # the job-time rules
    classes = config.get("architectures")
    model_class = classes[0] if isinstance(classes, list) and classes and isinstance(classes[0], str) else ""
    tied = config.get("tie_word_embeddings", _derived(family.model_type, kept).get("tie_word_embeddings", True))
    return CheckpointModel(
        task=chosen,
        params={"task": declared.task, "config": dict(declared.config)},
        model_class=model_class or family.model_type,
        labels=_labels(config),
        tied_lm_head=bool(tied),
    )
