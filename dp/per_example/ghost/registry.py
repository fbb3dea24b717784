"""Which layers with parameters the ghost engine handles, and how: one rule per module class.

A layer family registers its per-layer work function with `@ghost_layer(SomeModule, ...)` (as
Opacus registers its grad samplers), together with everything else the engine asks of that layer
type: the run-time check that a call keeps the batch on dimension 0, an optional refusal of
configurations the rule cannot make exact, and the parameter attributes the rule covers.
Supporting a new layer is therefore one new module in this package that registers itself and is
imported by the package ``__init__``.

Lookup is by exact type, never along the MRO: a subclass may override ``forward`` with something
the parent's rule does not describe, so it must be registered itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from dp.per_example.ghost.work import Calls, LayerWork, ParamNames

__all__ = [
    "GHOST_LAYERS",
    "GhostLayerRegistry",
    "GhostLayerRule",
    "LayerWorkFn",
    "ghost_layer",
    "rows_on_dim0",
]

M = TypeVar("M", bound=nn.Module)
M_contra = TypeVar("M_contra", bound=nn.Module, contravariant=True)


class LayerWorkFn(Protocol[M_contra]):
    """The per-layer rule: this chunk's calls of one layer -> its squared norms and weighted sum.

    `bk` says whether the weighted sum will be asked for (pass 2 = book-keeping), so a rule that
    has several exact forms can weigh that cost in its choice; rules with one form ignore it.
    """

    def __call__(self, module: M_contra, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork: ...


WorkFn = TypeVar("WorkFn", bound=LayerWorkFn[Any])
"""A work function as declared: registering returns it unchanged, so rules for several module
classes (each with its own call check) can be stacked on one function."""


# keeps_rows(module, input, output, batch): whether this call keeps the rows of the batch on
# dimension 0 in a form the rule understands (checked on every recorded call at run time).
KeepsRows = Callable[[M, torch.Tensor, torch.Tensor, int], bool]

# refusal(module) -> None when the rule is exact for this configuration, else the reason, worded
# to follow "module <where> (<type>)" (e.g. "uses max_norm ..."). Checked before any computation.
Refusal = Callable[[M], str | None]


def rows_on_dim0(module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """The default call check: at least (B, features) in, and B rows in and out."""
    return inp.dim() >= 2 and inp.shape[0] == batch and out.shape[0] == batch


@dataclass(frozen=True)
class GhostLayerRule(Generic[M]):
    """Everything the engine needs to know about one layer type."""

    work: LayerWorkFn[M]
    keeps_rows: KeepsRows[M]
    refusal: Refusal[M] | None
    parameters: tuple[str, ...]
    """The parameter attributes the rule computes gradients for; a module of this type that owns
    any other trainable parameter is refused."""


class GhostLayerRegistry:
    """Module class (exact type) -> its rule."""

    def __init__(self) -> None:
        self._rules: dict[type[nn.Module], GhostLayerRule[Any]] = {}

    def add(self, cls: type[M], rule: GhostLayerRule[M]) -> None:
        if cls in self._rules:
            raise ValueError(f"ghost clipping rule for {cls.__name__} registered twice")
        self._rules[cls] = rule

    def register(
        self,
        *classes: type[M],
        keeps_rows: KeepsRows[M] = rows_on_dim0,
        refusal: Refusal[M] | None = None,
        parameters: tuple[str, ...] = ("weight", "bias"),
    ) -> Callable[[WorkFn], WorkFn]:
        """Decorator on a work function: register it as the rule for each of `classes`."""
        if not classes:
            raise ValueError("ghost_layer needs at least one module class")

        def decorator(work: WorkFn) -> WorkFn:
            rule: GhostLayerRule[M] = GhostLayerRule(
                work=work, keeps_rows=keeps_rows, refusal=refusal, parameters=parameters
            )
            for cls in classes:
                self.add(cls, rule)
            return work

        return decorator

    def rule_for(self, module: nn.Module) -> GhostLayerRule[Any] | None:
        """The rule for `module`'s exact type, None if it has none."""
        return self._rules.get(type(module))

    def __contains__(self, cls: object) -> bool:
        return cls in self._rules

    def __iter__(self) -> Iterator[type[nn.Module]]:
        return iter(self._rules)


GHOST_LAYERS = GhostLayerRegistry()
ghost_layer = GHOST_LAYERS.register
