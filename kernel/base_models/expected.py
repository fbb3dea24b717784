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
from dataclasses import dataclass
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


def _ask_child(request: dict[str, Any], *, what: str) -> dict[str, Any]:
    """The capped child's answer to ``request``, or the problem that says why there is none."""
    body = json.dumps({**request, "limits": {"cpu_s": CHILD_CPU_S, "address_space_bytes": CHILD_ADDRESS_SPACE_BYTES}})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "privtrain_common.zoo.parameter_shapes"],
            input=body,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ShapesUnavailable(f"building {what} took longer than {CHILD_TIMEOUT_S:g} s") from None
    try:
        answer: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ShapesUnavailable(
            f"the service could not build {what} to check the weights (exit code {done.returncode})"
        ) from None
    if "unavailable" in answer:
        raise WeightCheckUnavailable(
            f"this deployment cannot check base-model weights: {answer['unavailable']}; run the API with "
            "the worker extra (torch) installed to accept base-model uploads"
        )
    if "error" in answer:
        raise ShapesUnavailable(f"{what}: {answer['error']}")
    return answer


def _tensors(answer: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {name: (str(t["dtype"]), tuple(int(d) for d in t["shape"])) for name, t in answer["tensors"].items()}


def expected_tensors(
    *, architecture: str, params: dict[str, Any], input_shape: tuple[int, ...], n_outputs: int
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name → (safetensors dtype, shape) of the model the worker would build."""
    request = {
        "architecture": architecture,
        "params": params,
        "input_shape": list(input_shape),
        "n_outputs": n_outputs,
    }
    return _tensors(_ask_child(request, what=f"architecture '{architecture}' with these params"))


@dataclass(frozen=True)
class CheckpointExpectation:
    """What a Transformers checkpoint's config gives (``privtrain_common.zoo.hf.checkpoint``), and
    the tensors of the `hf` model a job on it builds, named as the wrapper names them."""

    params: dict[str, Any]
    task: str
    model_class: str
    labels: int | None
    tied_lm_head: bool
    base_model_prefix: str
    head_members: tuple[str, ...]
    embedding_members: tuple[str, ...]
    parameters: int
    tensors: dict[str, tuple[str, tuple[int, ...]]]


def checkpoint_expectation(*, config: dict[str, Any], task: str | None) -> CheckpointExpectation:
    """Asked of the capped child, which reads the config as data and builds on the meta device."""
    answer = _ask_child({"kind": "hf-checkpoint", "config": config, "task": task}, what="the checkpoint's config.json")
    return CheckpointExpectation(
        params=answer["params"],
        task=str(answer["task"]),
        model_class=str(answer["model_class"]),
        labels=answer["labels"],
        tied_lm_head=bool(answer["tied_lm_head"]),
        base_model_prefix=str(answer["base_model_prefix"]),
        head_members=tuple(answer["head_members"]),
        embedding_members=tuple(answer["embedding_members"]),
        parameters=int(answer["parameters"]),
        tensors=_tensors(answer),
    )
