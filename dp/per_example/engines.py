"""Which per-sample gradient engine an algorithm runs on: the vmap engine or ghost clipping.

Both give the same results up to floating-point rounding; ghost clipping is faster where it is
exact for every layer of the model (`dp.per_example.ghost.supports`), so "auto" picks it there
and the vmap engine, which covers every supported module, elsewhere. Algorithms that take an
`engine` argument (DiceSGD, DC-DPSGD) resolve it here; tests and benchmarks force one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol, get_args

import torch
from torch import nn

from dp.per_example.ghost import iter_ghost_per_sample_grads
from dp.per_example.ghost import supports as ghost_supports
from dp.per_example.per_sample import iter_per_sample_grads

__all__ = ["ENGINES", "Engine", "PerSampleGrads", "check_engine", "per_sample_grads_of", "uses_ghost"]

Engine = Literal["auto", "vmap", "ghost"]
ENGINES: tuple[str, ...] = get_args(Engine)


class PerSampleGrads(Protocol):
    """`iter_per_sample_grads`'s signature: chunks of name -> (m, *param.shape)."""

    def __call__(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        loss: str,
        max_physical_batch_size: int,
    ) -> Iterator[dict[str, torch.Tensor]]: ...


def check_engine(engine: str) -> Engine:
    """`engine` itself, or ValueError naming the choices."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return engine  # type: ignore[return-value]


def uses_ghost(model: nn.Module, engine: Engine) -> bool:
    """Whether `engine` runs on ghost clipping for `model` ("auto": wherever it is exact)."""
    if check_engine(engine) == "auto":
        return ghost_supports(model)
    return engine == "ghost"


def per_sample_grads_of(model: nn.Module, engine: Engine) -> PerSampleGrads:
    """The per-sample gradient iterator `engine` uses for `model`."""
    return iter_ghost_per_sample_grads if uses_ghost(model, engine) else iter_per_sample_grads
