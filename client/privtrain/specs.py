"""Job specs: build one from keyword arguments, load one from a JSON/YAML file, override parts.

The client validates nothing the server validates (the server is the single source of truth and
answers 422 with the exact field); it only assembles the JSON document.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# A pair of mutually exclusive keys: setting one removes the other.
_EXCLUSIVE = {
    "target_epsilon": "noise_multiplier",
    "noise_multiplier": "target_epsilon",
    "epochs": "steps",
    "steps": "epochs",
}


class SpecFileError(ValueError):
    """The spec file cannot be read or is not a mapping."""


@dataclass(frozen=True)
class SpecOverrides:
    """Parts of a job spec given one by one (CLI flags); None means 'leave as is'."""

    dataset_id: str | None = None
    model: str | None = None
    model_params: Mapping[str, Any] = field(default_factory=dict)
    algorithm: str | None = None
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float | None = None
    epochs: float | None = None
    steps: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    init_job: str | None = None
    """model.init: start from this succeeded job's model."""
    init_base_model: str | None = None
    """model.init: start from this base model."""
    finetune: str | None = None
    finetune_k: int | None = None
    augmult: int | None = None
    """training.augmult: augmented views per sampled image (image datasets)."""
    rows_per_unit: int | None = None
    """training.rows_per_unit: rows averaged per sampled person (datasets with a privacy unit column)."""
    precision: str | None = None
    """training.precision: fp32 or bf16 (mixed precision)."""
    lora_rank: int | None = None
    """training.lora.rank: the adapters' rank (with finetune lora)."""
    lora_alpha: float | None = None
    """training.lora.alpha: the adapters' scale (with finetune lora)."""
    lora_targets: tuple[str, ...] = ()
    """training.lora.target_modules: the layers of an `hf` model that get adapters (default: the family's)."""
    eval_holdout_fraction: float | None = None
    """evaluation.holdout_fraction: the rows held out for the DP evaluation (it needs this)."""
    eval_mechanism: str | None = None
    """evaluation.mechanism: laplace (with eval_epsilon) or gaussian (with eval_noise_multiplier)."""
    eval_epsilon: float | None = None
    eval_noise_multiplier: float | None = None
    token_loss: str | None = None
    """training.token_loss: mean or sum of a row's token losses (language-model datasets)."""
    queue: str | None = None
    """resources.queue: the worker queue to run on (default: the model's size decides)."""


def _set(section: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        return
    section[key] = value
    other = _EXCLUSIVE.get(key)
    if other is not None:
        section.pop(other, None)


def merge_spec(base: Mapping[str, Any] | None, overrides: SpecOverrides) -> dict[str, Any]:
    """A copy of ``base`` with every given override applied (flags win over the file)."""
    spec: dict[str, Any] = copy.deepcopy(dict(base or {}))
    _set(spec, "dataset_id", overrides.dataset_id)
    model = spec.setdefault("model", {})
    _set(model, "name", overrides.model)
    model.setdefault("params", {}).update(overrides.model_params)
    algorithm = spec.setdefault("algorithm", {})
    _set(algorithm, "name", overrides.algorithm)
    algorithm.setdefault("hyperparameters", {}).update(overrides.hyperparameters)
    if overrides.init_job is not None:
        model["init"] = {"job_id": overrides.init_job}
    if overrides.init_base_model is not None:
        model["init"] = {"base_model_id": overrides.init_base_model}
    privacy = spec.setdefault("privacy", {})
    for key in ("target_epsilon", "noise_multiplier", "delta"):
        _set(privacy, key, getattr(overrides, key))
    if not privacy:  # the non-private optimizers (sgd, adam on public datasets) take none
        del spec["privacy"]
    training = spec.setdefault("training", {})
    for key in (
        "epochs",
        "steps",
        "batch_size",
        "learning_rate",
        "finetune",
        "finetune_k",
        "augmult",
        "rows_per_unit",
        "precision",
        "token_loss",
    ):
        _set(training, key, getattr(overrides, key))
    if overrides.lora_rank is not None or overrides.lora_alpha is not None or overrides.lora_targets:
        lora = training.setdefault("lora", {})
        _set(lora, "rank", overrides.lora_rank)
        _set(lora, "alpha", overrides.lora_alpha)
        _set(lora, "target_modules", list(overrides.lora_targets) or None)
    evaluation = {
        "holdout_fraction": overrides.eval_holdout_fraction,
        "mechanism": overrides.eval_mechanism,
        "epsilon": overrides.eval_epsilon,
        "noise_multiplier": overrides.eval_noise_multiplier,
    }
    if any(value is not None for value in evaluation.values()):
        section = spec.setdefault("evaluation", {})
        for key, value in evaluation.items():
            _set(section, key, value)
    if overrides.queue is not None:
        spec.setdefault("resources", {})["queue"] = overrides.queue
    return spec


def build_job_spec(
    *,
    dataset_id: str,
    model: str,
    algorithm: str,
    batch_size: int | None = None,
    learning_rate: float | None = None,
    epochs: float | None = None,
    steps: int | None = None,
    target_epsilon: float | None = None,
    noise_multiplier: float | None = None,
    delta: float | None = None,
    hyperparameters: Mapping[str, Any] | None = None,
    model_params: Mapping[str, Any] | None = None,
    evaluation: Mapping[str, Any] | None = None,
    init_job: str | None = None,
    init_base_model: str | None = None,
    finetune: str | None = None,
    finetune_k: int | None = None,
    augmult: int | None = None,
    rows_per_unit: int | None = None,
    precision: str | None = None,
    lora_rank: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: Sequence[str] = (),
    token_loss: str | None = None,
    queue: str | None = None,
) -> dict[str, Any]:
    """The JSON job spec the API expects, from keyword arguments.

    ``batch_size`` and ``learning_rate`` are left out when None: full-batch and single-pass algorithms refuse
    them (``privtrain algorithms NAME`` lists the training fields each reads). Without ``target_epsilon`` and
    ``noise_multiplier`` the spec has no privacy block (the non-private ``sgd``/``adam`` on public datasets).
    ``init_job``/``init_base_model`` set ``model.init``; ``finetune`` (full, head, last_k_blocks, lora) and
    ``finetune_k`` which parameters train, ``lora_rank``/``lora_alpha``/``lora_targets`` the adapters of
    finetune lora (the targets: an `hf` model's layers); ``augmult`` the augmented views per sampled image
    (image datasets); ``rows_per_unit`` the rows averaged per sampled person (datasets with a privacy unit
    column); ``precision`` fp32 or bf16; ``token_loss`` mean or sum (language-model datasets); ``queue`` the
    worker queue (resources.queue; by default the model's size decides)."""
    spec = merge_spec(
        None,
        SpecOverrides(
            dataset_id=dataset_id,
            model=model,
            model_params=dict(model_params or {}),
            algorithm=algorithm,
            hyperparameters=dict(hyperparameters or {}),
            target_epsilon=target_epsilon,
            noise_multiplier=noise_multiplier,
            delta=delta,
            epochs=epochs,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            init_job=init_job,
            init_base_model=init_base_model,
            finetune=finetune,
            finetune_k=finetune_k,
            augmult=augmult,
            rows_per_unit=rows_per_unit,
            precision=precision,
            lora_rank=lora_rank,
            lora_alpha=lora_alpha,
            lora_targets=tuple(lora_targets),
            token_loss=token_loss,
            queue=queue,
        ),
    )
    if evaluation is not None:
        spec["evaluation"] = dict(evaluation)
    return spec


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        import yaml  # only YAML spec files need PyYAML
    except ImportError as exc:
        raise SpecFileError(f"{path}: reading YAML needs PyYAML (pip install pyyaml); or use JSON") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecFileError(f"{path} is not valid YAML: {exc}") from exc


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SpecFileError(f"{path} is not valid JSON: {exc}") from exc


_PARSERS = {".yaml": _parse_yaml, ".yml": _parse_yaml}


def load_spec_file(path: str | Path) -> dict[str, Any]:
    """Read a spec from JSON, or YAML (``.yaml``/``.yml``, safe loader, needs PyYAML)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecFileError(f"cannot read {path}: {exc.strerror}") from exc
    loaded = _PARSERS.get(path.suffix.lower(), _parse_json)(path, text)
    if not isinstance(loaded, dict):
        raise SpecFileError(f"{path} must hold a mapping (the job spec), not {type(loaded).__name__}")
    return loaded


def parse_assignment(text: str) -> tuple[str, Any]:
    """``key=value``; the value is read as JSON when it is JSON (numbers, true, lists), else kept
    as a string (``optimizer=adam``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected key=value, got {text!r}")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip(), value
