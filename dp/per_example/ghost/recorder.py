"""Pass 1's hooks: record each call's input of every trainable registered layer and tap its output
so that its output gradient is handed over the moment the backward computes it.

Each forward hook keeps the layer's input detached and returns the output through
`_OutputGradientTap`, an identity in the graph whose backward passes the gradient δ on unchanged
after giving it to the recorder's `GradientInbox`. The engine opens the inbox for pass 1's
backward only and builds each layer's work as soon as its last call's δ has arrived, so a layer
whose work is smaller than its (a, δ) (a norm layer's per-sample gradients, a conv layer's
materialised ones) lets them go during the backward instead of at its end. The backward is asked
for the gradient of one scalar leaf (`Recorder.anchor`) that every tap takes as an input: that
makes autograd run every tap and capture nothing but the anchor's (None).

The recorder holds no output: an output autograd does not save (a norm layer's output feeding a
ReLU, a residual branch's last conv) is freed as in a plain forward. The tap's output is a
detached alias, not a view, so a later in-place op on it (an inplace activation) is allowed: the
tap sits before it in the graph and still receives the gradient w.r.t. the layer's own output.
A recorded input modified in place later in the forward would make the rules read values the
layer never saw: `check_versions` refuses that (ValueError naming the layer). At run time the
hooks also check, with the layer's rule, that each call keeps the batch on dimension 0
(ValueError naming the layer, never a shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from dp.per_example.ghost.optional import load_optional_families
from dp.per_example.ghost.registry import GHOST_LAYERS, GhostLayerRule
from dp.per_example.ghost.work import ParamNames
from dp.per_example.per_sample import trainable_parameters

__all__ = ["GradientInbox", "HookedLayer", "RecordedCall", "Recorder"]

# handler(call index in forward order, δ of that call's output)
GradientHandler = Callable[[int, torch.Tensor], None]


class GradientInbox:
    """Where the taps of one chunk deliver their output gradients: to the open handler, or
    nowhere (a second backward through a retained graph passes through the taps untouched)."""

    def __init__(self) -> None:
        self._handler: GradientHandler | None = None

    def open(self, handler: GradientHandler) -> None:
        self._handler = handler

    def close(self) -> None:
        self._handler = None

    def deliver(self, index: int, delta: torch.Tensor) -> None:
        if self._handler is not None:
            self._handler(index, delta)


class _OutputGradientTap(torch.autograd.Function):
    """y = x in the graph (a detached alias, no copy); backward: deliver δ, pass it on."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, anchor: torch.Tensor, inbox: GradientInbox, index: int) -> torch.Tensor:
        ctx.inbox, ctx.index = inbox, index
        return output.detach()

    @staticmethod
    def backward(ctx: Any, delta: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        ctx.inbox.deliver(ctx.index, delta)
        return delta, None, None, None


@dataclass
class RecordedCall:
    layer_index: int
    inp: torch.Tensor  # detached input
    inp_version: int
    shape: tuple[int, ...]  # the output's shape, dtype and device (a zero gradient for an output
    dtype: torch.dtype  # the loss ignores), kept as metadata: no tensor op per call
    device: torch.device

    def zero_gradient(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)


@dataclass(frozen=True)
class HookedLayer:
    where: str  # the module's name in the model, "<root>" for the model itself
    module: nn.Module
    rule: GhostLayerRule[Any]
    names: ParamNames  # the rule's parameter attributes -> trainable parameter names


@dataclass
class Recorder:
    """Forward hooks on the trainable layers; while active, records each call's input in forward
    order (`calls`) and taps its output into `inbox` (see the module docstring)."""

    model: nn.Module
    params: dict[str, nn.Parameter] | None = None
    """The model's trainable parameters when the caller has them already (one walk of the model
    fewer per call); None: looked up on entry."""
    layers: list[HookedLayer] = field(default_factory=list)
    calls: list[RecordedCall] = field(default_factory=list)
    batch: int = -1
    active: bool = False
    anchor: torch.Tensor | None = None
    inbox: GradientInbox = field(default_factory=GradientInbox)
    _handles: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list)

    def __enter__(self) -> Recorder:
        load_optional_families()  # the rules of an optional library's layers, before any hook is placed
        params = trainable_parameters(self.model) if self.params is None else self.params
        by_id = {id(p): name for name, p in params.items()}
        for name, module in self.model.named_modules():
            rule = GHOST_LAYERS.rule_for(module)
            if rule is not None and any(p.requires_grad for p in module.parameters(recurse=False)):
                where = name or "<root>"
                index = len(self.layers)
                self.layers.append(HookedLayer(where, module, rule, _param_names(module, rule, by_id)))
                self._handles.append(module.register_forward_hook(self._make_hook(index), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.calls = []
        self.anchor = None
        self.inbox.close()

    def start(self, batch: int) -> None:
        """A new chunk: no calls yet, no anchor (the first tap makes it, on its output's device),
        a fresh inbox (a retained graph of an earlier chunk delivers to its own, never to this one)."""
        self.calls = []
        self.batch = batch
        self.anchor = None
        self.inbox = GradientInbox()
        self.active = True

    def stop(self) -> None:
        self.active = False

    def _make_hook(self, layer_index: int) -> Callable[..., torch.Tensor | None]:
        def hook(
            module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object
        ) -> torch.Tensor | None:
            if not self.active:
                return None
            layer = self.layers[layer_index]
            inp = args[0] if args else kwargs.get("input")
            kind = type(module).__name__
            if not isinstance(inp, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise ValueError(f"module {layer.where} ({kind}) was not called on a single tensor")
            if not torch.is_grad_enabled():
                raise ValueError(f"module {layer.where} ({kind}) was called with gradients disabled")
            if not output.requires_grad:
                return None  # no gradient reaches this call's parameters: contributes nothing
            if not layer.rule.keeps_rows(module, inp, output, self.batch):
                raise ValueError(
                    f"module {layer.where} ({kind}) got an input that does not keep the rows of the "
                    "batch on dimension 0; the ghost clipping engine cannot make it per-sample"
                )
            if self.anchor is None:  # on the model's device: the whole backward stays on it
                self.anchor = torch.zeros((), device=output.device, requires_grad=True)
            tapped: torch.Tensor = _OutputGradientTap.apply(  # type: ignore[no-untyped-call]
                output, self.anchor, self.inbox, len(self.calls)
            )
            self.calls.append(
                RecordedCall(layer_index, inp.detach(), inp._version, tuple(output.shape), output.dtype, output.device)
            )
            return tapped

        return hook

    def check_versions(self) -> None:
        """After the forward: no recorded input was modified in place (the rules would read
        values the layer never saw)."""
        for call in self.calls:
            if call.inp._version != call.inp_version:
                layer = self.layers[call.layer_index]
                raise ValueError(
                    f"the input of module {layer.where} ({type(layer.module).__name__}) is modified in "
                    "place later in the forward; the ghost clipping engine does not support this"
                )


def _param_names(module: nn.Module, rule: GhostLayerRule[Any], by_id: dict[int, str]) -> ParamNames:
    """The rule's parameter attributes -> trainable parameter names (None: absent or frozen)."""
    names: ParamNames = {}
    for pname in rule.parameters:
        p = getattr(module, pname, None)
        names[pname] = by_id.get(id(p)) if isinstance(p, nn.Parameter) else None
    return names
