"""Which tensors an architecture has, asked of a capped child process (the API never imports torch).

``python -m privtrain_common.zoo.parameter_shapes`` builds the model on torch's meta device (no memory for the
weights) and prints its state dict's names, shapes and dtypes. The child runs under a wall-clock
timeout and limits its own CPU time and address space before importing torch (no ``preexec_fn``,
which is unsafe in a threaded server), so a request for an absurd architecture costs at most those.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from kernel.errors import InvalidInput, Unavailable

CHILD_TIMEOUT_S = 60.0
CHILD_CPU_S = 60
CHILD_ADDRESS_SPACE_BYTES = 16 * 1024**3
"""Generous: importing torch maps gigabytes of virtual memory; the meta device allocates none."""


class ShapesUnavailable(InvalidInput):
    """The architecture could not be built with these params (or the child failed)."""

    def __init__(self, detail: str) -> None:
        super().__init__(slug="base-model-architecture-invalid", detail=detail)


class WeightCheckUnavailable(Unavailable):
    """The API host cannot build architectures (no torch), so it cannot validate uploaded weights."""

    def __init__(self, detail: str) -> None:
        super().__init__(slug="base-model-check-unavailable", detail=detail)


def expected_tensors(
    *, architecture: str, params: dict[str, Any], input_shape: tuple[int, ...], n_outputs: int
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name → (safetensors dtype, shape) of the model the worker would build."""
    request = json.dumps(
        {
            "architecture": architecture,
            "params": params,
            "input_shape": list(input_shape),
            "n_outputs": n_outputs,
            "limits": {"cpu_s": CHILD_CPU_S, "address_space_bytes": CHILD_ADDRESS_SPACE_BYTES},
        }
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "privtrain_common.zoo.parameter_shapes"],
            input=request,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ShapesUnavailable(f"building '{architecture}' took longer than {CHILD_TIMEOUT_S:g} s") from None
    try:
        answer = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ShapesUnavailable(
            f"the service could not build '{architecture}' to check the weights (exit code {done.returncode})"
        ) from None
    if "unavailable" in answer:
        raise WeightCheckUnavailable(
            f"this deployment cannot check base-model weights: {answer['unavailable']}; run the API with "
            "the worker extra (torch) installed to accept base-model uploads"
        )
    if "error" in answer:
        raise ShapesUnavailable(f"architecture '{architecture}' with these params: {answer['error']}")
    return {name: (str(t["dtype"]), tuple(int(d) for d in t["shape"])) for name, t in answer["tensors"].items()}
