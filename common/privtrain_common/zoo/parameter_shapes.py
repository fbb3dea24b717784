"""The tensors a zoo model's state dict holds (names, shapes, dtypes), built on the meta device.

The server validates uploaded base-model weights against this list without importing torch in the
API process: it runs ``python -m privtrain_common.zoo.parameter_shapes`` as a capped child process, feeding a
JSON request on stdin ({"architecture", "params", "input_shape", "n_outputs"}) and reading
{"tensors": {name: {"shape": [...], "dtype": "F32"}}} (or {"error": "..."}, or {"unavailable": "..."}
when torch is missing) from stdout. The meta
device allocates no memory, so even a large architecture costs only its module objects. The
request may carry ``limits`` ({"cpu_s", "address_space_bytes"}): the child applies them to itself
before importing torch (the parent then needs no ``preexec_fn``, which is unsafe in a threaded
server).
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Mapping
from typing import Any

SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "uint8": "U8",
    "bool": "BOOL",
}


def expected_tensors(
    architecture: str, params: Mapping[str, object], *, input_shape: tuple[int, ...], n_outputs: int
) -> dict[str, dict[str, object]]:
    """Every entry of the built model's ``state_dict()`` with its shape and safetensors dtype."""
    # torch is optional (the worker extra): the architectures load only when a model is built
    import torch

    from privtrain_common.zoo.architectures import build_model

    with torch.device("meta"):
        model = build_model(architecture, params, input_shape=input_shape, n_outputs=n_outputs)
    return {
        name: {"shape": list(tensor.shape), "dtype": _dtype_name(tensor.dtype)}
        for name, tensor in model.state_dict().items()
    }


def hf_checkpoint(config: object, *, task: str | None) -> dict[str, object]:
    """A Transformers checkpoint's config (``format=hf`` uploads): the `hf` params it gives, the
    class it was saved from, and the tensors of the model a job on it builds, named as the zoo's
    wrapper names them (``model.`` + Transformers' names), with the prefix a bare body's names
    lack (``base_model_prefix``) and the head's members (which an upload may leave out)."""
    # torch and Transformers are optional (the worker extra): loaded only when a model is built
    import torch

    from privtrain_common.zoo.architectures import FINETUNE_BLOCKS, build_model  # optional: torch
    from privtrain_common.zoo.hf.checkpoint import read_checkpoint_config  # optional: Transformers
    from privtrain_common.zoo.hf.families import FAMILIES, input_shape_of  # only when a checkpoint is read

    checkpoint = read_checkpoint_config(config, task=task)
    settings = dict(checkpoint.params["config"])
    family = FAMILIES[settings["model_type"]]
    if family.image:  # images (C, H, W): no vocabulary, no padding
        outputs, shape = checkpoint.labels or 2, input_shape_of(family, settings)
    else:
        settings.setdefault("pad_token_id", 0)  # the dataset's at job time; shapes do not depend on it
        vocab = int(settings["vocab_size"]) if "vocab_size" in settings else None
        if vocab is None:
            raise ValueError("config.json must give vocab_size (the checkpoint's embedding rows)")
        outputs, shape = (vocab if checkpoint.task == "causal-lm" else (checkpoint.labels or 2)), (1,)
    params = {"task": checkpoint.task, "config": settings}
    with torch.device("meta"):
        model = build_model("hf", params, input_shape=shape, n_outputs=outputs)
    state = model.state_dict()
    blocks = getattr(model, FINETUNE_BLOCKS)
    return {
        "params": checkpoint.params,
        "task": checkpoint.task,
        "model_class": checkpoint.model_class,
        "labels": checkpoint.labels,
        "tied_lm_head": checkpoint.tied_lm_head,
        "base_model_prefix": str(getattr(model.model, "base_model_prefix", "")),
        "head_members": list(blocks["head"]),
        "embedding_members": list(blocks["embedding"]),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "tensors": {name: {"shape": list(t.shape), "dtype": _dtype_name(t.dtype)} for name, t in state.items()},
    }


def _dtype_name(dtype: Any) -> str:
    plain = str(dtype).removeprefix("torch.")
    return SAFETENSORS_DTYPES.get(plain, plain)


def _limit_self(limits: Mapping[str, Any]) -> None:
    if "cpu_s" in limits:
        cpu = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    if "address_space_bytes" in limits:
        space = int(limits["address_space_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (space, space))


def main() -> None:
    request = json.loads(sys.stdin.read())
    _limit_self(request.get("limits") or {})
    try:
        import torch  # noqa: F401  (a deployment without it cannot check weights: say so)
    except ImportError:
        json.dump({"unavailable": "torch is not installed where the API runs"}, sys.stdout)
        return
    if request.get("kind") == "hf-checkpoint":
        try:
            answer = hf_checkpoint(request["config"], task=request.get("task"))
        except (ValueError, TypeError, KeyError) as exc:
            json.dump({"error": str(exc)}, sys.stdout)
            return
        json.dump(answer, sys.stdout)
        return
    try:
        tensors = expected_tensors(
            str(request["architecture"]),
            request["params"],
            input_shape=tuple(int(v) for v in request["input_shape"]),
            n_outputs=int(request["n_outputs"]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        json.dump({"error": str(exc)}, sys.stdout)
        return
    json.dump({"tensors": tensors}, sys.stdout)


if __name__ == "__main__":
    main()
