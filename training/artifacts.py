"""Training checkpoints as safetensors files — never pickles (model files: privtrain_common.model_files).

Checkpoints (`save_training_state` / `load_training_state`) use the model files' format so that
the worker never needs torch.load. They are secret (see TrainingState) and never released.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save as safetensors_save

from dp.loop.state import TrainingState
from privtrain_common.model_files import cpu_contiguous, read_safetensors, write_atomically

__all__ = ["load_checkpoint_extras", "load_training_state", "save_training_state"]

_CHECKPOINT_KEY = "privtrain.checkpoint"
_CHECKPOINT_VERSION = 1
_EXTRAS_PREFIX = "extra/"


# ----------------------------------------------------------------------------- checkpoints


def save_training_state(path: Path, state: TrainingState, *, extras: Mapping[str, torch.Tensor] | None = None) -> str:
    """Write a TrainingState checkpoint atomically as safetensors; return the sha256 hex.

    Optimizer tensors are stored per parameter index; its non-tensor entries and param_groups
    go to JSON metadata. ``extras`` are the runner's own tensors (e.g. the parameter average,
    training/ema.py), stored under ``extra/``. SECRET file: keep it on worker storage only.
    """
    optimizer_state = state.optimizer_state
    per_param = optimizer_state.get("state", {})
    param_groups = optimizer_state.get("param_groups", [])
    if not isinstance(per_param, Mapping) or not isinstance(param_groups, list):
        raise ValueError("optimizer_state must be an optimizer state_dict")
    tensors: dict[str, torch.Tensor] = {f"model/{k}": v for k, v in state.model_state.items()}
    scalars: dict[str, dict[str, object]] = {}
    for index, entries in per_param.items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer/{int(index)}/{key}"] = value
            else:
                scalars.setdefault(str(int(index)), {})[key] = value
    tensors["generator_state"] = state.generator_state
    tensors.update({f"{_EXTRAS_PREFIX}{k}": v for k, v in (extras or {}).items()})
    header = {
        "version": _CHECKPOINT_VERSION,
        "step": state.step,
        "param_groups": param_groups,
        "optimizer_scalars": scalars,
        "optimizer_indices": sorted(int(i) for i in per_param),
    }
    try:
        header_json = json.dumps(header, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"optimizer state is not plain JSON apart from tensors: {exc}") from exc
    data = safetensors_save(cpu_contiguous(tensors), metadata={_CHECKPOINT_KEY: header_json})
    return write_atomically(Path(path), data)


def load_training_state(path: Path) -> TrainingState:
    """Read a checkpoint written by `save_training_state`."""
    tensors, metadata = read_safetensors(Path(path))
    raw = metadata.get(_CHECKPOINT_KEY)
    if raw is None:
        raise ValueError(f"{path} is not a privtrain checkpoint")
    header = json.loads(raw)
    if header.get("version") != _CHECKPOINT_VERSION:
        raise ValueError(f"unsupported checkpoint version {header.get('version')!r}")
    model_state = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
    per_param: dict[int, dict[str, object]] = {i: {} for i in header["optimizer_indices"]}
    for key, value in tensors.items():
        if key.startswith("optimizer/"):
            _, index, name = key.split("/", 2)
            per_param[int(index)][name] = value
    for index, entries in header["optimizer_scalars"].items():
        per_param[int(index)].update(entries)
    return TrainingState(
        step=int(header["step"]),
        model_state=model_state,
        optimizer_state={"state": per_param, "param_groups": header["param_groups"]},
        generator_state=tensors["generator_state"],
    )


def load_checkpoint_extras(path: Path) -> dict[str, torch.Tensor]:
    """The ``extras`` tensors a checkpoint was saved with (empty when none)."""
    tensors, _ = read_safetensors(Path(path))
    return {k.removeprefix(_EXTRAS_PREFIX): v for k, v in tensors.items() if k.startswith(_EXTRAS_PREFIX)}
