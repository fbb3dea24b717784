"""The service's model catalogue: the zoo's table checked against a dataset and the service's limits.

The zoo itself (names, parameter declarations, shape and size rules, fine-tuning blocks) lives
once in ``privtrain_common.zoo.catalogue``, which the worker's torch builders read too. What is
the service's own stays here: the pydantic schema a job's params are validated with (a 422 at
submission instead of a worker crash), the task a dataset offers, the size limits from the
settings, and the ``finetune_k`` refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from kernel.config import Settings, get_settings
from kernel.datasets.facts import DatasetFacts
from kernel.errors import FinetuneKOutOfRange
from kernel.model_params import declared_params, params_model
from kernel.registry import Registry, UnknownName
from privtrain_common.zoo.catalogue import CATALOGUE
from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry

__all__ = [
    "MODELS",
    "ModelDefinition",
    "ModelIncompatible",
    "ModelSize",
    "ModelSizeLimits",
    "UnknownModel",
    "get_model",
]

UnknownModel = UnknownName


@dataclass(frozen=True)
class ModelSizeLimits:
    """The service's bounds on a model, checked before any budget is reserved."""

    max_parameters: int
    max_activation_bytes: int
    physical_batch_size: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelSizeLimits:
        return cls(
            max_parameters=settings.max_model_parameters,
            max_activation_bytes=settings.max_activation_bytes,
            physical_batch_size=settings.max_physical_batch_size,
        )

    @classmethod
    def for_gpu(cls, settings: Settings, *, device_memory_bytes: int) -> ModelSizeLimits:
        """A GPU worker's chunks: up to ``gpu_max_physical_batch_size`` rows in a share of the
        device's memory (at least the service's ``max_activation_bytes``, which the API checks a
        single row against, so a model the API admitted always fits one row)."""
        share = int(settings.gpu_activation_memory_fraction * device_memory_bytes)
        return cls(
            max_parameters=settings.max_model_parameters,
            max_activation_bytes=max(settings.max_activation_bytes, share),
            physical_batch_size=settings.gpu_max_physical_batch_size,
        )

    def rows_per_chunk(self, size: ModelSize) -> int:
        """Rows per per-sample-gradient chunk for this model: the service's physical batch, or fewer
        when that many rows would not fit ``max_activation_bytes`` (0: not even one row fits).
        Chunking never changes a result, so a long-sequence model trains in smaller chunks
        instead of being refused."""
        return min(self.physical_batch_size, self.max_activation_bytes // size.batch_bytes(1))


@dataclass(frozen=True)
class ModelDefinition:
    """One zoo entry as the service validates it (``entry`` holds the zoo's own rules)."""

    entry: ZooEntry
    params_model: type[BaseModel]
    """The pydantic schema of the entry's parameter declaration (``kernel.model_params``)."""

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def summary(self) -> str:
        return self.entry.summary

    @property
    def tasks(self) -> frozenset[str]:
        return self.entry.tasks

    @property
    def lora(self) -> bool:
        """Whether ``training.finetune: lora`` applies: the model has attention and MLP Linear layers."""
        return self.entry.lora

    @property
    def lora_targets(self) -> dict[str, dict[str, list[str]]]:
        """Per `hf` model type, the default and accepted ``training.lora.target_modules`` (else empty)."""
        return {
            variant: {key: list(names) for key, names in targets.items()}
            for variant, targets in self.entry.lora_targets.items()
        }

    @property
    def body_from(self) -> frozenset[str]:
        """Other models whose weights this one can start from, body reused and head new."""
        return self.entry.body_from

    def params_from_init(self, params: dict[str, Any], init_params: dict[str, Any]) -> dict[str, Any] | None:
        """A job's params when it starts from weights whose params are ``init_params``: taken from
        the weights where the model says so, else None (the job's own, which must be the init's)."""
        if self.entry.start_from is None:
            return None
        return self.entry.start_from(params, init_params)

    def size(self, params: BaseModel, facts: DatasetFacts, n_outputs: int) -> ModelSize:
        """The model's size from its validated params; runs only after the shape check passed."""
        return self.entry.size(declared_params(self.entry.params, params), facts, n_outputs)

    def validate(
        self,
        params: dict[str, Any],
        facts: DatasetFacts,
        *,
        limits: ModelSizeLimits | None = None,
    ) -> dict[str, Any]:
        """Validate params (defaults filled), compatibility and size; returns the normalised params.

        ``limits`` defaults to the process settings, so the planner needs no extra argument; a
        model too large for the worker is refused here instead of failing there after its
        privacy reservation was made (and committed).
        """
        if self.entry.complete is not None:
            params = self.entry.complete(dict(params), facts)
        try:
            parsed = self.params_model.model_validate(params)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(part) for part in first["loc"])
            raise ModelIncompatible(f"model.params.{loc}: {first['msg']}") from exc
        if facts.task not in self.tasks:
            raise ModelIncompatible(f"model '{self.name}' supports {sorted(self.tasks)}, the dataset is {facts.task}")
        self.entry.check_shape(declared_params(self.entry.params, parsed), facts)
        self._check_size(
            self.size(parsed, facts, self.n_outputs(facts)),
            limits or ModelSizeLimits.from_settings(get_settings()),
        )
        return parsed.model_dump(mode="json")

    def facts_for_weights(
        self, params: dict[str, Any], *, input_shape: tuple[int, ...], n_outputs: int
    ) -> DatasetFacts:
        """Facts standing for any dataset that weights of this architecture fit (a base-model upload
        has no dataset): a language model's task when it takes one, else classification with
        ``n_outputs`` classes (regression for one output); a text model's vocab_size and pad_id are
        the ones its params give."""
        if "language-model" in self.tasks:
            task = "language-model"
        elif n_outputs > 1:
            task = "classification"
        else:
            task = "regression"
        vocabulary = {field: params.get(field) for field in self.entry.dataset_params}
        return DatasetFacts(
            n_rows=1,
            feature_shape=input_shape,
            task=task,
            n_classes=n_outputs if task == "classification" else None,
            **vocabulary,
        )

    def rows_per_chunk(self, params: dict[str, Any], facts: DatasetFacts, *, limits: ModelSizeLimits) -> int:
        """Rows per per-sample-gradient chunk the worker uses for this model (params must be valid)."""
        parsed = self.params_model.model_validate(params)
        return max(1, limits.rows_per_chunk(self.size(parsed, facts, self.n_outputs(facts))))

    def parameter_count(self, params: dict[str, Any], facts: DatasetFacts) -> int:
        """Trainable parameters of the model the worker would build; params must be valid."""
        parsed = self.params_model.model_validate(params)
        return self.size(parsed, facts, self.n_outputs(facts)).parameters

    def block_names(self, params: dict[str, Any]) -> list[str]:
        """The fine-tuning blocks ``last_k_blocks`` counts from the end; params must be valid."""
        parsed = self.params_model.model_validate(params)
        return self.entry.blocks(declared_params(self.entry.params, parsed))

    def block_count(self, params: dict[str, Any]) -> int:
        """How many fine-tuning blocks the model has: the largest ``training.finetune_k``."""
        return len(self.block_names(params))

    def check_lora(self, params: dict[str, Any], target_modules: list[str] | None) -> bool:
        """Whether ``training.finetune: lora`` also trains the head; ModelIncompatible for target
        modules the model has not (or any, on a model whose adapters sit on fixed layers)."""
        if self.entry.check_lora is None:
            if target_modules is not None:
                raise ModelIncompatible(
                    f"training.lora.target_modules chooses the layers of an 'hf' model; model '{self.name}' "
                    "takes the service's adapters on its attention and MLP Linear layers: leave it out"
                )
            return False
        parsed = self.params_model.model_validate(params)
        targets = tuple(target_modules) if target_modules is not None else None
        return self.entry.check_lora(declared_params(self.entry.params, parsed), targets)

    def check_finetune_k(self, params: dict[str, Any], finetune_k: int) -> None:
        """Refuse a ``finetune_k`` above the block count at submission, not on the worker."""
        names = self.block_names(params)
        if finetune_k > len(names):
            raise FinetuneKOutOfRange(model=self.name, finetune_k=finetune_k, blocks=names)

    def _check_size(self, size: ModelSize, limits: ModelSizeLimits) -> None:
        if size.parameters > limits.max_parameters:
            raise ModelIncompatible(
                f"model '{self.name}' with these params has {size.parameters} trainable "
                f"parameters on this dataset; the service's limit is {limits.max_parameters}"
            )
        if limits.rows_per_chunk(size) < 1:
            raise ModelIncompatible(
                f"model '{self.name}' with these params needs about {size.batch_bytes(1)} bytes of "
                f"activations and per-sample gradients for a single row ({size.parameters} parameters, "
                f"{size.activations} activations per row); the service's limit per physical batch is "
                f"{limits.max_activation_bytes} bytes"
            )

    def n_outputs(self, facts: DatasetFacts) -> int:
        if facts.task == "regression":
            return 1
        if facts.task == "language-model":  # next-token logits: one output per token id
            assert facts.vocab_size is not None
            return facts.vocab_size
        assert facts.n_classes is not None
        return facts.n_classes


MODELS: Registry[ModelDefinition] = Registry("model")
get_model = MODELS.get

for _entry in CATALOGUE.values():
    MODELS.add(_entry.name, ModelDefinition(entry=_entry, params_model=params_model(_entry.params)))
