"""The chunked pass 1 shared by every ghost entry point: per-row squared norms and layer works.

Per chunk of `max_physical_batch_size` rows: one forward with the recorder's hooks, then one
backward of the summed loss that computes only the gradients δ of the loss w.r.t. the recorded
layer outputs: it is asked for the gradient of the recorder's anchor, a scalar leaf that every
output tap takes as an input (recorder.py), so autograd skips every weight-gradient kernel and
this costs less than a normal backward. Because the loss is a sum of per-row terms and every
registered layer treats rows independently, row i of δ is row i's own output gradient, so g_i of a
layer is a function of (a_i, δ_i) only, and the layer's rule (registry.py) turns the recorded
(a, δ) into its squared norms and weighted sum. The per-layer squared norms (float64, each within
a float64 sum's relative error of the exact value, or above it) are summed in float64, in layer
order, to the joint flat norm (dp/per_example/clip_margin.py).

Memory: each layer's rule runs inside the backward, as soon as the tap has delivered its last
call's δ (`_LayerWorks`), and the engine then lets go of that layer's (a, δ): what the work does
not keep (a norm layer's input and output gradient, once turned into (B, C) per-sample gradients)
is freed while the backward goes on, instead of every layer's δ existing at once at its end. The
recorder holds no layer output, so an output autograd does not save for itself (a residual
branch's last layer, a norm layer's output feeding a ReLU) is freed in the forward as without
hooks. Peak memory of a step against a non-private one: docs/benchmarks.md#peak-memory-of-the-ghost-engine.

Device-agnostic: each chunk is moved to the parameters' device.

Mixed precision (`precision="bf16"`, dp/precision.py): only the forward runs under
bf16 autocast, so the recorded a and the δ autograd returns may be bfloat16. Every floating (a, δ)
is cast to float32 before a rule sees it, and the rules run outside autocast, so each layer's
squared norms (in float64) and weighted sum (in float32) are computed from the same float32
(a, δ). With pass 2 = "bk" the norm of row i and the contribution scale_i·g_i added for row i are
then both functions of that one float32 (a_i, δ_i) — exactly what the float32 engine computes from
its own (a_i, δ_i) — so the clipping bound of dp/per_example/clip_margin.py holds; bf16 only
changes which g_i is clipped, through the rounding upstream of (a, δ). The model
output is cast to float32 before the loss, so the loss and its gradient start in float32 too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from dp.losses import LossSpec, get_loss
from dp.per_example.ghost.recorder import RecordedCall, Recorder
from dp.per_example.ghost.support import check_ghost_supported
from dp.per_example.ghost.work import LayerWork
from dp.per_example.per_sample import chunk_placement, physical_chunks
from dp.precision import (
    Precision,
    accumulation_view,
    autocast_context,
    check_precision,
)

__all__ = ["Chunk", "iter_chunks", "pass1"]


@dataclass
class Chunk:
    sq_norms: torch.Tensor
    works: list[LayerWork]
    out_grad: torch.Tensor | None
    out: torch.Tensor | None


def pass1(
    model: nn.Module,
    recorder: Recorder,
    x: torch.Tensor,
    target: torch.Tensor,
    spec: LossSpec,
    *,
    bk: bool,
    want_out_grad: bool,
    retain_graph: bool,
    precision: Precision = "fp32",
) -> Chunk:
    """Forward and output-gradient backward of one chunk; `bk`: the weighted sums will be asked
    for; `want_out_grad`/`retain_graph`: what a second backward (pass 2) needs; `precision`: the
    forward's autocast (norms and sums are float32 either way, see the module docstring)."""
    batch = x.shape[0]
    recorder.start(batch)
    with torch.enable_grad():  # also when the caller runs under torch.no_grad()
        try:
            with autocast_context(precision, device_type=x.device.type):
                out = model(x)
        finally:
            recorder.stop()
        recorder.check_versions()
        return _pass1_backward(
            recorder,
            accumulation_view(precision, out),
            target,
            spec,
            bk=bk,
            want_out_grad=want_out_grad,
            retain_graph=retain_graph,
            precision=precision,
        )


class _LayerWorks:
    """Builds each layer's work from its calls' (a, δ) as the taps deliver the δ: a layer's work is
    built when its last call's δ arrives, and its (a, δ) are let go then (the work keeps what its
    rule needs). Calls whose output the loss ignores get zero δ at `finish`."""

    def __init__(self, recorder: Recorder, *, bk: bool, precision: Precision) -> None:
        self._recorder = recorder
        self._bk = bk
        self._precision = precision
        self._calls: dict[int, RecordedCall] = dict(enumerate(recorder.calls))  # by forward order
        self._deltas: dict[int, torch.Tensor] = {}
        self._pending: dict[int, list[int]] = {}  # layer index -> its calls, forward order
        for index, call in self._calls.items():
            self._pending.setdefault(call.layer_index, []).append(index)
        self._left = {layer: len(calls) for layer, calls in self._pending.items()}  # calls without δ
        self.works: dict[int, LayerWork] = {}

    def receive(self, index: int, delta: torch.Tensor) -> None:
        layer = self._calls[index].layer_index
        self._deltas[index] = delta
        self._left[layer] -= 1
        if self._left[layer] == 0:
            self._build(layer)

    def _build(self, layer_index: int) -> None:
        calls = []
        for index in self._pending.pop(layer_index):
            call = self._calls.pop(index)
            delta = self._deltas.pop(index, None)
            if delta is None:
                delta = call.zero_gradient()
            # float32 under bf16 before any rule sees them: the norms and sums are float32 throughout.
            calls.append((accumulation_view(self._precision, call.inp), accumulation_view(self._precision, delta)))
        layer = self._recorder.layers[layer_index]
        self.works[layer_index] = layer.rule.work(layer.module, layer.names, calls, bk=self._bk)

    def finish(self) -> list[LayerWork]:
        """Every layer's work, in layer order (the order of the norms' sum does not depend on the
        backward's order)."""
        for layer_index in list(self._pending):
            self._build(layer_index)
        return [self.works[index] for index in sorted(self.works)]


def _pass1_backward(
    recorder: Recorder,
    out: torch.Tensor,
    target: torch.Tensor,
    spec: LossSpec,
    *,
    bk: bool,
    want_out_grad: bool,
    retain_graph: bool,
    precision: Precision,
) -> Chunk:
    if not out.requires_grad or not recorder.calls:
        raise ValueError("the model output does not depend on any trainable parameter")
    layer_works = _LayerWorks(recorder, bk=bk, precision=precision)
    recorder.calls = []  # from here each call's (a, δ) lives only until its layer's work is built
    loss = spec.fn(out, target)
    assert recorder.anchor is not None
    # the anchor's edge, not the anchor: autograd.grad takes tensors or edges, not a mix
    inputs: list[GradientEdge] = [get_gradient_edge(recorder.anchor)]
    if want_out_grad:
        inputs.append(get_gradient_edge(out))
    recorder.inbox.open(layer_works.receive)
    try:
        grads = torch.autograd.grad(loss, inputs, allow_unused=True, retain_graph=retain_graph)
    finally:
        recorder.inbox.close()
    out_grad = grads[1] if want_out_grad else None
    works = layer_works.finish()
    sq = works[0].sq_norms
    for work in works[1:]:
        sq = sq + work.sq_norms
    return Chunk(sq, works, out_grad, out if retain_graph else None)


def iter_chunks(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    params: dict[str, nn.Parameter],
    loss: str,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> Iterator[tuple[LossSpec, torch.Tensor, torch.Tensor]]:
    """(loss spec, rows, targets) per chunk on the parameters' device and dtype; `params`: the
    model's trainable parameters (`trainable_parameters`, looked up once by the caller). Checks the
    arguments, `check_ghost_supported` and the precision (bf16 needs float32 parameters, and no
    autocast region of the caller's may be active) when first advanced, before any computation."""
    if isinstance(max_physical_batch_size, bool) or max_physical_batch_size < 1:
        raise ValueError(f"max_physical_batch_size must be >= 1, got {max_physical_batch_size}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    check_precision(precision)
    check_ghost_supported(model)
    device, dtype = chunk_placement(params, precision)
    spec = get_loss(loss)
    for x, target in physical_chunks(X, y, spec=spec, rows=max_physical_batch_size, device=device, dtype=dtype):
        yield spec, x, target
