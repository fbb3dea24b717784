"""One architecture of the zoo, described without torch: what the catalogue holds per name.

An entry says which parameters the model takes, which tasks it serves, whether it can take a
dataset's rows, how large it is and which fine-tuning blocks it has, all from its parameters and
the dataset's public facts. The torch builder registered under the same name builds exactly the
model the entry describes (tests pin the two together).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from privtrain_common.zoo.inputs import InputFacts
from privtrain_common.zoo.params import ParamsSpec

_FLOAT32_BYTES = 4


class ModelIncompatible(ValueError):
    """The model cannot be trained on the dataset (task or shape)."""


@dataclass(frozen=True)
class ModelSize:
    """What a model costs in memory, computed without torch from its params and feature shape."""

    parameters: int
    """Trainable parameters: the same count as torch's sum(p.numel() for p in parameters())."""
    activations: int
    """Values one example's forward pass produces (its input and every layer's output)."""

    def batch_bytes(self, batch_size: int) -> int:
        """Float32 bytes one physical batch holds: forward and backward activations, and one
        per-sample gradient per row (the per-sample engine materialises chunk × parameters)."""
        return batch_size * _FLOAT32_BYTES * (2 * self.activations + self.parameters)


@dataclass(frozen=True)
class ZooEntry:
    """A zoo model by name. The callables take the validated parameters, an instance of ``params``."""

    name: str
    summary: str
    params: type[ParamsSpec]
    """The parameter declaration (``privtrain_common.zoo.params``)."""
    tasks: frozenset[str]
    check_shape: Callable[[Any, InputFacts], None]
    """(params, facts) → None, or ModelIncompatible when the rows do not fit the model."""
    size: Callable[[Any, InputFacts, int], ModelSize]
    """(params, facts, n_outputs) → the model's size; runs only after check_shape passed."""
    blocks: Callable[[Any], list[str]]
    """params → the names of the model's fine-tuning blocks, first to last, as the torch module
    declares them (``privtrain_common.zoo.architectures.FINETUNE_BLOCKS``)."""
    complete: Callable[[dict[str, Any], InputFacts], dict[str, Any]] | None = None
    """Fills the ``dataset_params`` (a text model's vocab_size and pad_id) before validation,
    refusing a given value that differs (ModelIncompatible)."""
    dataset_params: tuple[str, ...] = ()
    """The params that belong to the dataset, not to the job: ``complete`` fills them in."""
    lora: bool = False
    """Whether ``training.finetune: lora`` applies: the model has attention and MLP Linear layers."""
    lora_targets: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    """For models whose LoRA layers a job chooses (``training.lora.target_modules``): per variant (an
    `hf` model type), the ``default`` layers and the ``accepted`` ones."""
    check_lora: Callable[[Any, tuple[str, ...] | None], bool] | None = None
    """(params, training.lora.target_modules) → whether LoRA also trains the model's head (a classifier's
    new head, as PEFT's ``modules_to_save``), or ModelIncompatible for layer names the model has not.
    None: the service's own adapters, on fixed layers (no target_modules), with the head frozen."""
    body_from: frozenset[str] = frozenset()
    """Other zoo models whose weights this one can start from: their body is this model's (the same
    parameter names and shapes for the params they share), the head is new. A classifier starts
    from a language model of the same transformer, as Transformers' ``…ForSequenceClassification``
    starts from an LM checkpoint."""
    start_from: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    """(job params, init params) → the params of a job that starts from given weights, when they
    need not be given again (ModelIncompatible when they contradict the weights). None: the job's
    params must be the init's exactly and its rows of the init's shape."""
