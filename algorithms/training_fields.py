"""Which ``training.*`` fields an algorithm reads.

``batch_size`` and ``learning_rate`` are optional in :class:`TrainingSpec` because full-batch and
single-pass algorithms have no use for them: each catalogue entry declares the fields it reads
(``AlgorithmDefinition.training_fields``). Submission refuses a field the algorithm would ignore,
requires the ones it reads, and a full-batch algorithm records ``batch_size = n`` itself (n is
public: the registered row count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from algorithms.errors import MissingTrainingFields, UnusedTrainingField
from kernel.schemas.jobs import TrainingSpec

FINETUNE_FIELDS: Final[frozenset[str]] = frozenset({"finetune", "finetune_k", "lora"})
"""Which parameters train, with ``model.init``: about the model, the same for every algorithm,
so not listed among an algorithm's ``training_fields`` (docs/pretraining-and-finetuning.md)."""
TASK_FIELDS: Final[frozenset[str]] = frozenset({"token_loss"})
"""About the dataset's task, the same for every algorithm that accepts the task: checked against
the dataset at submission (kernel/jobs/planning.py), not listed among ``training_fields``."""
ALL_TRAINING_FIELDS: Final[frozenset[str]] = frozenset(TrainingSpec.model_fields) - FINETUNE_FIELDS - TASK_FIELDS
PER_ALGORITHM_FIELDS: Final[tuple[str, ...]] = ("batch_size", "learning_rate")
"""Optional in the schema; required by exactly the algorithms that read them."""
OPTIONAL_PER_ALGORITHM_FIELDS: Final[tuple[str, ...]] = ("ema_decay", "augmult", "precision", "rows_per_unit")
"""Never required; refused by the algorithms that do not list them (parameter averaging makes no
sense where the analysis releases one specific iterate: the single-pass and KL-family ones;
augmentation multiplicity needs a trainer that averages each row's gradient over its views, and
bf16 a trainer whose per-sample norms are accumulated in float32; rows per privacy unit a trainer
that averages each unit's rows before clipping)."""
ENGINE_OPTION_FIELDS: Final[frozenset[str]] = frozenset({"augmult", "precision", "rows_per_unit"})
"""Read only by the trainers built on the per-sample-map aggregator (the per-sample-map family and
sgd/adam), which list them; every other algorithm refuses them."""
DEFAULT_TRAINING_FIELDS: Final[frozenset[str]] = ALL_TRAINING_FIELDS - ENGINE_OPTION_FIELDS
"""An algorithm's fields unless it declares its own."""
PER_UNIT_TRAINING_FIELDS: Final[frozenset[str]] = DEFAULT_TRAINING_FIELDS | {"rows_per_unit"}
"""The fields of an algorithm with its own aggregator that also trains per privacy unit
(DC-DPSGD, DiceSGD): each unit's rows averaged before the algorithm's own rule."""
_ENGINE_OPTION_READERS = "dp-sgd, dp-adam, auto-s, dp-psac, sgd and adam"
ENGINE_OPTION_UNUSED_REASONS: Final[Mapping[str, str]] = {
    "augmult": f"trains on each sampled row as it is (augmentation multiplicity is implemented for "
    f"{_ENGINE_OPTION_READERS})",
    "precision": f"computes in float32 (bf16 mixed precision is implemented for {_ENGINE_OPTION_READERS})",
    "rows_per_unit": "does not train per privacy unit (the catalogue's algorithms with privacy_units: true do)",
}
"""Complete 'training.<field>: <name> … and does not use it' for the engine options."""
SCHEDULE_FIELDS: Final[frozenset[str]] = ALL_TRAINING_FIELDS - frozenset(
    PER_ALGORITHM_FIELDS + OPTIONAL_PER_ALGORITHM_FIELDS
)
"""epochs / steps / time_limit_s: read for every job."""


def accept_training(
    training: TrainingSpec,
    *,
    algorithm: str,
    reads: frozenset[str],
    unused_reasons: Mapping[str, str],
    full_batch_rows: int | None,
) -> TrainingSpec:
    """The training spec an algorithm runs with: unused fields refused, read ones required, and
    ``batch_size = full_batch_rows`` recorded for a full-batch algorithm."""
    for field in PER_ALGORITHM_FIELDS + OPTIONAL_PER_ALGORITHM_FIELDS:
        if field not in reads and getattr(training, field) is not None:
            reason = unused_reasons.get(field, "does not read it")
            raise UnusedTrainingField(f"training.{field}: {algorithm} {reason} and does not use it; leave it out")
    missing = tuple(f for f in PER_ALGORITHM_FIELDS if f in reads and getattr(training, f) is None)
    if missing:
        raise MissingTrainingFields(missing)
    if full_batch_rows is None:
        return training
    return training.model_copy(update={"batch_size": full_batch_rows})


def batch_size_of(training: TrainingSpec) -> int:
    """``training.batch_size`` of an algorithm that reads it (submission has required it)."""
    if training.batch_size is None:
        raise MissingTrainingFields(("batch_size",))
    return training.batch_size


def learning_rate_of(training: TrainingSpec) -> float:
    """``training.learning_rate`` of an algorithm that reads it (submission has required it)."""
    if training.learning_rate is None:
        raise MissingTrainingFields(("learning_rate",))
    return training.learning_rate


def training_schema(reads: frozenset[str]) -> dict[str, Any]:
    """TrainingSpec's JSON schema narrowed to the fields an algorithm reads: the per-algorithm
    fields it reads are required, the others are not listed (they would be refused)."""
    schema = TrainingSpec.model_json_schema()
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k in reads}
    required = [*schema.get("required", []), *(f for f in PER_ALGORITHM_FIELDS if f in reads)]
    schema["required"] = sorted(set(required), key=list(schema["properties"]).index)
    return schema
