"""Model files as safetensors — never pickles: written by the service's worker, read by anyone.

A model file holds the state_dict tensors and, in its metadata under "privtrain.config", the
JSON architecture config. `load_model` is THE documented way to rebuild a downloaded model: it
rebuilds the architecture from the zoo by name (no code is ever loaded) and loads the tensors
with strict=True.

A model fine-tuned with LoRA is stored merged (W + (alpha/r)·B·A in the plain architecture); its
config records ``"lora": {"rank", "alpha", "merged": true}``, and it loads like any other model.
An `hf` model's file also holds the PEFT adapter, its tensors named behind ``ADAPTER_PREFIX`` and
``adapter_config.json``'s contents in ``lora.adapter_config``; loading skips them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_save
from torch import nn

from privtrain_common.atomic_files import write_atomically
from privtrain_common.model_format import ADAPTER_PREFIX, CONFIG_KEY, FORMAT_VERSION, TASKS
from privtrain_common.zoo.architectures import build_model

__all__ = [
    "CONFIG_KEY",
    "FORMAT_VERSION",
    "TASKS",
    "LoadedModel",
    "cpu_contiguous",
    "load_model",
    "read_safetensors",
    "save_model",
    "write_atomically",
]


# ----------------------------------------------------------------------------- files


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """All tensors (on the CPU) and the metadata of a safetensors file; ValueError if invalid."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            # safe_open is not iterable (SIM118 does not apply): keys() is how it lists its tensors
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except SafetensorError as exc:
        raise ValueError(f"{path} is not a readable safetensors file: {exc}") from exc
    return tensors, metadata


def cpu_contiguous(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # clone(): safetensors refuses tensors that share storage (e.g. tied weights).
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


# ----------------------------------------------------------------------------- model artifacts


def _validate_config(
    config: Mapping[str, object],
) -> tuple[str, dict[str, object], tuple[int, ...], int]:
    """Check the fields load_model relies on; return (name, params, input_shape, n_outputs)."""
    if not isinstance(config, Mapping):
        raise ValueError("model config must be a JSON object")
    if config.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"unsupported model format_version {config.get('format_version')!r}; expected {FORMAT_VERSION}"
        )
    model = config.get("model")
    if not isinstance(model, Mapping) or not isinstance(model.get("name"), str):
        raise ValueError("model config needs model.name (a string)")
    params = model.get("params", {})
    if not isinstance(params, Mapping):
        raise ValueError("model config's model.params must be an object")
    input_shape = config.get("input_shape")
    if not isinstance(input_shape, (list, tuple)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in input_shape
    ):
        raise ValueError(f"model config's input_shape must be a list of ints, got {input_shape!r}")
    n_outputs = config.get("n_outputs")
    if not isinstance(n_outputs, int) or isinstance(n_outputs, bool):
        raise ValueError(f"model config's n_outputs must be an int, got {n_outputs!r}")
    if config.get("task") not in TASKS:
        raise ValueError(f"model config's task must be one of {TASKS}, got {config.get('task')!r}")
    return model["name"], dict(params), tuple(input_shape), n_outputs


def _rebuild(config: Mapping[str, object], state: Mapping[str, torch.Tensor]) -> nn.Module:
    name, params, input_shape, n_outputs = _validate_config(config)
    # A throwaway seeded generator (non-private: the init is overwritten, and the global RNG
    # stays untouched); privacy-protecting draws use SecureRandom, never torch.Generator.
    model = build_model(
        name, params, input_shape=input_shape, n_outputs=n_outputs, generator=torch.Generator().manual_seed(0)
    )
    own = {name: tensor for name, tensor in state.items() if not name.startswith(ADAPTER_PREFIX)}
    try:
        model.load_state_dict(own, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"tensors do not match the {name!r} architecture: {exc}") from exc
    return model


def save_model(
    path: Path,
    model: nn.Module,
    *,
    config: Mapping[str, object],
    adapter: Mapping[str, torch.Tensor] | None = None,
) -> str:
    """Write `model` to `path` as safetensors with `config` as metadata; return the sha256 hex.

    `config` must contain at least format_version (1), model {name, params}, input_shape,
    n_outputs and task. Before writing, the architecture is rebuilt from `config` and the
    tensors are loaded into it strictly, so every file written is one `load_model` can read.
    `adapter`: a PEFT adapter's tensors, stored behind ``ADAPTER_PREFIX`` (module docstring).
    """
    tensors = cpu_contiguous(model.state_dict())
    _rebuild(config, tensors)
    tensors.update({ADAPTER_PREFIX + name: tensor for name, tensor in cpu_contiguous(dict(adapter or {})).items()})
    try:
        config_json = json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"model config is not plain JSON: {exc}") from exc
    data = safetensors_save(tensors, metadata={CONFIG_KEY: config_json})
    return write_atomically(Path(path), data)


class LoadedModel(NamedTuple):
    """A rebuilt model and its config; unpacks as ``model, config`` like a pair, and calling it
    runs the model: ``loaded(X)``."""

    model: nn.Module
    config: dict[str, object]

    def __call__(self, inputs: object) -> torch.Tensor:
        """The model's outputs on ``inputs`` (a tensor, or anything ``torch.as_tensor`` takes: a NumPy
        array, nested lists), without gradients, on the model's device. Floating inputs are cast to
        the model's dtype; a text model's token ids stay integers."""
        parameter = next(self.model.parameters())
        tensor = torch.as_tensor(inputs, device=parameter.device)
        if tensor.is_floating_point():
            tensor = tensor.to(parameter.dtype)
        with torch.no_grad():
            out: torch.Tensor = self.model(tensor)
        return out

    @property
    def task(self) -> str:
        return str(self.config["task"])

    @property
    def classes(self) -> list[str] | None:
        """The dataset's public class list: output i of a classifier is ``classes[i]`` (None for
        regression, and for models written before class lists were recorded)."""
        classes = self.config.get("classes")
        return [str(name) for name in classes] if isinstance(classes, list) else None


def load_model(path: Path | str, *, map_location: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild a saved model: (module in eval mode on `map_location`, its config).

    Reads only safetensors (no pickle, no code). Raises ValueError for a file that is not a
    privtrain model: missing or malformed config, an unknown model name, mismatched tensors.
    """
    tensors, metadata = read_safetensors(Path(path))
    raw = metadata.get(CONFIG_KEY)
    if raw is None:
        raise ValueError(f"{path} has no {CONFIG_KEY!r} metadata; not a privtrain model")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} has malformed {CONFIG_KEY!r} metadata: {exc}") from exc
    model = _rebuild(config, tensors)
    model.to(torch.device(map_location))
    model.eval()
    return LoadedModel(model, config)
