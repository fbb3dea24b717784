"""The chunked pass 1 shared by every ghost entry point: per-row squared norms and layer works.

Per chunk of `max_physical_batch_size` rows: one forward with the recorder's hooks, then one
backward of the summed loss asked only for the gradients δ of the loss w.r.t. the recorded layer
outputs (`torch.autograd.grad(loss, outputs)`): autograd then skips every weight-gradient kernel,
so this costs less than a normal backward. Because the loss is a sum of per-row terms and every
registered layer treats rows independently, row i of δ is row i's own output gradient, so g_i of a
layer is a function of (a_i, δ_i) only, and the layer's rule (registry.py) turns the recorded
(a, δ) into its squared norms and weighted sum. The per-layer squared norms are summed to the
joint flat norm.

Memory: the backward is asked for the gradients at the outputs' gradient edges, not at the output
tensors, so an output autograd does not save for itself (a residual branch's last Linear, say)
is freed after the forward instead of held through the backward; and each layer's (a, δ) is
released as soon as its rule has built its work (a rule that materialises per-row gradients keeps
those instead). This took a transformer-lm's DP step from 2.9× to 1.9× the non-private peak
memory at T = 128 (docs/benchmarks.md).

Device-agnostic: each chunk is moved to the parameters' device.

Mixed precision (`precision="bf16"`, worker/optimizers/precision.py): only the forward runs under
bf16 autocast, so the recorded a and the δ autograd returns may be bfloat16. Every floating (a, δ)
is cast to float32 before a rule sees it, and the rules run outside autocast, so each layer's
squared norms and weighted sum are computed and accumulated in float32 from the same float32
(a, δ). With pass 2 = "bk" the norm of row i and the contribution scale_i·g_i added for row i are
then both functions of that one float32 (a_i, δ_i) computed in float32 — exactly what the float32
engine computes from its own (a_i, δ_i) — so the clipping bound holds with float32's rounding
slack; bf16 only changes which g_i is clipped, through the rounding upstream of (a, δ). The model
output is cast to float32 before the loss, so the loss and its gradient start in float32 too.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge

from worker.optimizers.ghost.recorder import Recorder
from worker.optimizers.ghost.support import check_ghost_supported
from worker.optimizers.ghost.work import LayerWork
from worker.optimizers.losses import LossSpec, get_loss, prepare_targets
from worker.optimizers.per_sample import trainable_parameters
from worker.optimizers.precision import (
    Precision,
    accumulation_view,
    autocast_context,
    check_no_outer_autocast,
    check_precision,
    check_precision_parameters,
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
    recorded = recorder.take_taps()
    if not out.requires_grad:
        raise ValueError("the model output does not depend on any trainable parameter")
    loss = spec.fn(out, target)
    inputs = [tap.edge for tap in recorded]
    if want_out_grad:
        inputs.append(get_gradient_edge(out))
    grads = list(
        torch.autograd.grad(
            loss,
            inputs,
            allow_unused=True,  # an output that does not reach the loss: zeros (gradient edges
            retain_graph=retain_graph,  # cannot be materialised by autograd itself)
        )
    )
    out_grad = grads.pop() if want_out_grad else None
    per_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for tap, g in zip(recorded, grads, strict=True):
        delta = tap.zero_gradient() if g is None else g
        # float32 under bf16 before any rule sees them: the norms and sums are float32 throughout.
        per_layer.setdefault(tap.layer_index, []).append(
            (accumulation_view(precision, tap.inp), accumulation_view(precision, delta))
        )
    del recorded, grads  # from here each layer's (a, δ) lives only as long as its rule keeps them
    works = []
    for index in list(per_layer):
        layer = recorder.layers[index]
        works.append(layer.rule.work(layer.module, layer.names, per_layer.pop(index), bk=bk))
    sq = works[0].sq_norms
    for work in works[1:]:
        sq = sq + work.sq_norms
    return Chunk(sq, works, out_grad, out if retain_graph else None)


def iter_chunks(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> Iterator[tuple[LossSpec, torch.Tensor, torch.Tensor]]:
    """(loss spec, rows, targets) per chunk on the parameters' device and dtype. Checks the
    arguments, `check_ghost_supported` and the precision (bf16 needs float32 parameters, and no
    autocast region of the caller's may be active) when first advanced, before any computation."""
    if isinstance(max_physical_batch_size, bool) or max_physical_batch_size < 1:
        raise ValueError(f"max_physical_batch_size must be >= 1, got {max_physical_batch_size}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    check_precision(precision)
    check_ghost_supported(model)
    params = trainable_parameters(model)
    if not params:
        raise ValueError("model has no trainable parameters")
    check_precision_parameters(precision, params.values())
    first = next(iter(params.values()))
    device, dtype = first.device, first.dtype
    check_no_outer_autocast(device.type)
    spec = get_loss(loss)
    for start in range(0, X.shape[0], max_physical_batch_size):
        x = X[start : start + max_physical_batch_size].to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        target = prepare_targets(spec, y[start : start + max_physical_batch_size].to(device), dtype=dtype)
        yield spec, x, target
