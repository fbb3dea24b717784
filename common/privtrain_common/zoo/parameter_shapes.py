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
