"""Pass 1's forward hooks: record each call's (input, output) of every trainable registered layer.

Each hook keeps the layer's input detached and its output still in the graph, so one backward
asked only for the gradients w.r.t. those outputs gives every layer's (a, δ). At run time the
hooks check, with the layer's rule, that each call keeps the batch on dimension 0, and afterwards
that no recorded tensor was modified in place (e.g. ReLU(inplace=True) after a Linear); either
failure raises ValueError naming the layer (never a shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from worker.optimizers.ghost.registry import GHOST_LAYERS, GhostLayerRule
from worker.optimizers.ghost.work import ParamNames
from worker.optimizers.per_sample import trainable_parameters

__all__ = ["HookedLayer", "RecordedCall", "Recorder", "Tap"]


@dataclass
class RecordedCall:
    inp: torch.Tensor  # detached input
    out: torch.Tensor  # output, still in the graph
    inp_version: int
    out_version: int


@dataclass(frozen=True)
class Tap:
    """What the backward of pass 1 needs of one recorded call."""

    layer_index: int
    inp: torch.Tensor  # detached input
    edge: GradientEdge  # where the output's gradient arrives
    like: torch.Tensor  # empty, with the output's dtype and device (zeros for an unused output)
    shape: tuple[int, ...]  # the output's shape

    def zero_gradient(self) -> torch.Tensor:
        return self.like.new_zeros(self.shape)


@dataclass(frozen=True)
class HookedLayer:
    where: str  # the module's name in the model, "<root>" for the model itself
    module: nn.Module
    rule: GhostLayerRule[Any]
    names: ParamNames  # the rule's parameter attributes -> trainable parameter names


@dataclass
class Recorder:
    """Forward hooks on the trainable layers; records (input, output) per call while active."""

    model: nn.Module
    layers: list[HookedLayer] = field(default_factory=list)
    calls: dict[int, list[RecordedCall]] = field(default_factory=dict)
    batch: int = -1
    active: bool = False
    _handles: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list)

    def __enter__(self) -> Recorder:
        by_id = {id(p): name for name, p in trainable_parameters(self.model).items()}
        for name, module in self.model.named_modules():
            rule = GHOST_LAYERS.rule_for(module)
            if rule is not None and any(p.requires_grad for p in module.parameters(recurse=False)):
                where = name or "<root>"
                self.layers.append(HookedLayer(where, module, rule, _param_names(module, rule, by_id)))
                hook = self._make_hook(where, rule)
                self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.calls.clear()

    def start(self, batch: int) -> None:
        self.calls = {id(layer.module): [] for layer in self.layers}
        self.batch = batch
        self.active = True

    def stop(self) -> None:
        self.active = False

    def _make_hook(self, where: str, rule: GhostLayerRule[Any]) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object) -> None:
            if not self.active:
                return
            inp = args[0] if args else kwargs.get("input")
            kind = type(module).__name__
            if not isinstance(inp, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise ValueError(f"module {where} ({kind}) was not called on a single tensor")
            if not torch.is_grad_enabled():
                raise ValueError(f"module {where} ({kind}) was called with gradients disabled")
            if not output.requires_grad:
                return  # no gradient reaches this call's parameters: contributes nothing
            if not rule.keeps_rows(module, inp, output, self.batch):
                raise ValueError(
                    f"module {where} ({kind}) got an input that does not keep the rows of the "
                    "batch on dimension 0; the ghost clipping engine cannot make it per-sample"
                )
            self.calls[id(module)].append(RecordedCall(inp.detach(), output, inp._version, output._version))

        return hook

    def take_taps(self) -> list[Tap]:
        """One tap per recorded call, in layer order; the recorder lets go of every call. Gradient
        edges instead of the outputs themselves: autograd keeps only the outputs it saved for its
        backward, so an output nothing saves (a residual branch's last Linear, the logits) is freed
        before the backward instead of held to its end."""
        taps = [
            Tap(index, call.inp, get_gradient_edge(call.out), call.out.new_zeros((0,)), tuple(call.out.shape))
            for index, layer in enumerate(self.layers)
            for call in self.calls[id(layer.module)]
        ]
        self.calls = {}
        return taps

    def check_versions(self) -> None:
        for layer in self.layers:
            for call in self.calls[id(layer.module)]:
                if call.inp._version != call.inp_version or call.out._version != call.out_version:
                    raise ValueError(
                        f"the input or output of module {layer.where} "
                        f"({type(layer.module).__name__}) is modified in place later in the "
                        "forward (e.g. an inplace activation); the ghost clipping engine does not "
                        "support this"
                    )


def _param_names(module: nn.Module, rule: GhostLayerRule[Any], by_id: dict[int, str]) -> ParamNames:
    """The rule's parameter attributes -> trainable parameter names (None: absent or frozen)."""
    names: ParamNames = {}
    for pname in rule.parameters:
        p = getattr(module, pname, None)
        names[pname] = by_id.get(id(p)) if isinstance(p, nn.Parameter) else None
    return names
