"""Arithmetic precision of the per-sample gradient engines: "fp32" (default) or "bf16" mixed precision.

Under "bf16" the model's forward (and the backward autograd derives from it) runs under
`torch.autocast(..., dtype=torch.bfloat16)`: matrix products and convolutions read and write
bfloat16, which is what makes them fast on GPUs with bf16 tensor cores. The parameters stay
float32, and everything the privacy guarantee rests on stays float32 too: each engine turns what
the bf16 computation produced into float32 per-sample contributions, computes each row's norm
from exactly that float32 contribution, scales it, and adds it up in float32. So the clipping
bound ||scale_i·g_i|| ≤ C holds with float32's rounding slack, not bfloat16's, whatever bf16 did
to g_i on the way (g_i is then a less accurate gradient, but still a function of row i alone,
up to rounding that — as in float32, only larger — may depend on the chunk's shape through the
kernels chosen; so under bf16 the chunk size can change the result in the last bf16 bits).

On a CPU autocast also works (so tests exercise this path), but it is usually slower than float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Literal, get_args

import torch

__all__ = [
    "PRECISIONS",
    "Precision",
    "accumulation_view",
    "autocast_context",
    "check_no_outer_autocast",
    "check_precision",
    "check_precision_parameters",
]

Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

# precision -> context manager factory, given the device type the parameters live on.
_CONTEXTS: dict[str, Callable[[str], AbstractContextManager[object]]] = {
    "fp32": lambda device_type: contextlib.nullcontext(),
    "bf16": lambda device_type: torch.autocast(device_type, dtype=torch.bfloat16),
}


def check_precision(precision: object) -> Precision:
    """`precision` itself if it is one of PRECISIONS, else ValueError (checked before any computation)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def check_precision_parameters(precision: Precision, parameters: Iterable[torch.Tensor]) -> None:
    """bf16 mixed precision keeps float32 parameters: it is what makes the norms and sums float32.

    (float64 parameters would be left alone by autocast, and bfloat16 parameters would make the
    norms bfloat16, so both are refused rather than silently meaning something else.)
    """
    if precision == "fp32":
        return
    for p in parameters:
        if p.dtype != torch.float32:
            raise ValueError(f"precision {precision!r} needs float32 parameters, got {p.dtype}")


def check_no_outer_autocast(device_type: str) -> None:
    """Refuse a caller's own autocast region: the engines choose where autocast applies (the
    forward only), and under a caller's region their float32 norms and sums would silently be
    computed in reduced precision. Ask for `precision="bf16"` instead."""
    if torch.is_autocast_enabled(device_type):
        raise ValueError(
            f"the per-sample gradient engine was called inside an autocast region on {device_type}; "
            "call it outside and pass precision='bf16' instead"
        )


def autocast_context(precision: Precision, *, device_type: str) -> AbstractContextManager[object]:
    """The context the forward runs under: bf16 autocast on `device_type`, or nothing for fp32."""
    return _CONTEXTS[check_precision(precision)](device_type)


def accumulation_view(precision: Precision, t: torch.Tensor) -> torch.Tensor:
    """`t` as the engines compute norms and sums from it: float32 under bf16, unchanged under fp32.

    Integer tensors (an Embedding's indices) are never cast.
    """
    if precision == "fp32" or not t.is_floating_point():
        return t
    return t.float()
