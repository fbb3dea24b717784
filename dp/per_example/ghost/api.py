"""The ghost engine's entry points: per-sample norms, the clipped sum (three pass-2 modes), several
weighted sums from one pass, per-sample gradients built from pass 1's records, and the DP-SGD
aggregator built on them.

Same contract as `dp.per_example.per_sample.clipped_grad_sum` (read its docstring): the
result is Σ_i scale_i·g_i with scale_i = per_sample_map.scale_factors(||g_i||), ||·|| the flat L2
norm over ALL trainable parameters jointly, rows whose norm is not finite contribute exactly 0,
chunks of `max_physical_batch_size` rows bound memory and never change the result, an empty batch
gives zeros. Scales come from the map; rows with a non-finite norm get scale 0 and are masked to
zero in every operand (0·inf would be NaN). The only host synchronisation is one read per
chunk, whether every row's norm is finite (`_chunk_scales`), as in clipped_grad_sum (checking is
cheaper than masking every operand).

Pass 2 — the clipped sum Σ_i scale_i·g_i = ∇_θ Σ_i scale_i·ℓ_i, with the scales constants. Three
exact ways, chosen by `pass2` (measured in bench/engine_compare.py; "bk" is the fastest on every
case measured, so it is the default):

- "bk" (book-keeping): no second backward at all. Each layer's weighted sum is computed by its
  rule from the stored (a, δ) — one GEMM per layer, the same work as the weight-gradient kernels
  pass 1 skipped — or a tensordot of the scales with already materialised per-sample gradients.
- "retain": pass 1 keeps its graph; a second backward of the model output with output gradient
  scale_i·∂ℓ_i/∂out_i (a VJP, which equals ∇ Σ scale_i ℓ_i because the loss is a sum of per-row
  terms).
- "recompute": pass 1 frees its graph; forward again on the rows with a finite norm and backward
  with the same scaled output gradient.
"retain" and "recompute" never see rows with a non-finite norm: "recompute" drops them and
"retain" falls back to "recompute" for any chunk that has one (a scale of 0 does not stop NaN
from an inf activation propagating through the second backward).

Mixed precision, `precision="bf16"` (dp/precision.py): the forward runs under bf16
autocast and every per-sample norm and every sum is float32 (engine.py says how). Only "bk" is
offered: its contribution for row i and the norm that scales it come from the same float32 (a_i,
δ_i), so ||scale_i·g_i|| ≤ C holds with float32 rounding. "retain" and "recompute" would form the
sum with a second backward through the bf16 graph, whose weight-gradient kernels round the SUM
over rows to bfloat16 and use the bf16-cast inputs, while the norms came from float32 (a, δ): the
added contribution is then not the one whose norm was measured, and the rounding of a sum cannot
be charged to one row. They raise ValueError under bf16 rather than weaken the bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from dp.per_example.aggregator import BatchContext, MapAggregator, TensorDict
from dp.per_example.clip_margin import norm_upper_bound
from dp.per_example.ghost.engine import Chunk, iter_chunks, pass1
from dp.per_example.ghost.recorder import Recorder
from dp.per_example.ghost.work import Totals
from dp.per_example.per_sample import PerSampleMap, trainable_parameters
from dp.precision import Precision, check_precision

__all__ = [
    "PASS2_MODES",
    "GhostClipAggregator",
    "Pass2",
    "ghost_clipped_grad_sum",
    "ghost_per_sample_norms",
    "ghost_weighted_grad_sums",
    "iter_ghost_per_sample_grads",
]

Pass2 = Literal["bk", "retain", "recompute"]
PASS2_MODES: tuple[str, ...] = ("bk", "retain", "recompute")


def _dtype_of(params: dict[str, nn.Parameter]) -> torch.dtype:
    """The dtype of the scales and sums: the parameters' (float32 under bf16 too)."""
    return next(iter(params.values())).dtype


def _norm_terms(params: dict[str, nn.Parameter]) -> int:
    """An upper bound on the terms of one row's squared norm: every value, and the partial sums of
    the layer rules (at most one per value and one per parameter tensor), twice over for margin."""
    return 2 * (sum(p.numel() for p in params.values()) + len(params))


def _chunk_scales(
    sq_norms: torch.Tensor, per_sample_maps: Sequence[PerSampleMap], *, dtype: torch.dtype, terms: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each map's scales (m, B) for a chunk's squared norms, and the rows with a finite norm (None:
    every row). A row with a non-finite norm gets scale 0 in every map.

    The check is the chunk's one host synchronisation (as in clipped_grad_sum: masking every
    operand costs more than checking): the sum of the squared norms, all ≥ 0 or NaN, is finite
    exactly when every row's is, unless it overflows, and then the rows are checked one by one.
    One reduction and one read, where a per-row test and `all` took six operations."""
    norms = norm_upper_bound(sq_norms, terms=terms, dtype=dtype)  # clip_margin.py
    each = [per_sample_map.scale_factors(norms) for per_sample_map in per_sample_maps]
    scales = each[0].unsqueeze(0) if len(each) == 1 else torch.stack(each)
    finite: torch.Tensor | None = None
    if not math.isfinite(sq_norms.sum().item()):
        finite = torch.isfinite(norms)
        if bool(finite.all()):  # the sum overflowed; every row is finite
            finite = None
        else:
            scales = torch.where(finite, scales, 0.0)
    return scales.to(dtype), finite


@dataclass(frozen=True)
class _Chunking:
    """How an entry point walks its rows: the model's trainable parameters, the loss, the chunk
    size and the forward's precision."""

    params: dict[str, nn.Parameter]
    loss: str
    max_physical_batch_size: int
    precision: Precision


def _recorded_chunks(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    recorder: Recorder,
    chunking: _Chunking,
    *,
    bk: bool,
    want_out_grad: bool = False,
    retain_graph: bool = False,
) -> Iterator[tuple[torch.Tensor, Chunk]]:
    """Each chunk's rows and its pass 1 under ``recorder`` (the arguments are checked when the
    first chunk is drawn, before any computation). Holds no chunk between draws."""
    chunks = iter_chunks(
        model,
        X,
        y,
        params=chunking.params,
        loss=chunking.loss,
        max_physical_batch_size=chunking.max_physical_batch_size,
        precision=chunking.precision,
    )
    for spec, x, target in chunks:
        yield (
            x,
            pass1(
                model,
                recorder,
                x,
                target,
                spec,
                bk=bk,
                want_out_grad=want_out_grad,
                retain_graph=retain_graph,
                precision=chunking.precision,
            ),
        )


def ghost_per_sample_norms(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> torch.Tensor:
    """||g_i|| (flat L2 over all trainable parameters) for every row, shape (n,), on the
    parameters' device, computed in float32 under bf16 too. Private: for tests and for algorithms
    that keep it inside the worker."""
    norms = []
    params = trainable_parameters(model)
    with Recorder(model, params) as recorder:
        chunking = _Chunking(params, loss, max_physical_batch_size, precision)
        chunks = _recorded_chunks(model, X, y, recorder, chunking, bk=False)
        for _, chunk in chunks:
            norms.append(norm_upper_bound(chunk.sq_norms, terms=_norm_terms(params), dtype=_dtype_of(params)))
    if not norms:
        first = next(iter(params.values()))
        return torch.zeros(0, dtype=first.dtype, device=first.device)
    return torch.cat(norms)


def ghost_clipped_grad_sum(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    per_sample_map: PerSampleMap,
    max_physical_batch_size: int,
    pass2: Pass2 = "bk",
    precision: Precision = "fp32",
) -> dict[str, torch.Tensor]:
    """Σ_i scale_i · g_i over the rows of (X, y): the same result as `clipped_grad_sum`.

    Returns name -> tensor of the parameter's shape on the parameter's device (zeros for an empty
    batch), in the parameters' dtype (float32 under bf16). Raises ValueError, before any
    computation, for a model `supports` rejects, and for pass2 "retain"/"recompute" under bf16
    (module docstring). The model is not modified (hooks are removed, `.grad` is never touched).
    """
    if pass2 not in PASS2_MODES:
        raise ValueError(f"pass2 must be one of {PASS2_MODES}, got {pass2!r}")
    if check_precision(precision) != "fp32" and pass2 != "bk":
        raise ValueError(
            f"pass2={pass2!r} is not offered with precision={precision!r}: its second backward rounds the "
            "clipped sum in bfloat16, which breaks the per-row clipping bound; use pass2='bk'"
        )
    params = trainable_parameters(model)
    totals = Totals()
    with Recorder(model, params) as recorder:
        chunking = _Chunking(params, loss, max_physical_batch_size, precision)
        second = {"want_out_grad": pass2 != "bk", "retain_graph": pass2 == "retain"}  # what pass 2 needs
        chunks = _recorded_chunks(model, X, y, recorder, chunking, bk=pass2 == "bk", **second)
        for x, chunk in chunks:
            with torch.no_grad():
                scales, finite = _chunk_scales(
                    chunk.sq_norms, (per_sample_map,), dtype=_dtype_of(params), terms=_norm_terms(params)
                )
            if pass2 == "bk":
                with torch.no_grad():
                    for work in chunk.works:
                        work.accumulate(scales, finite, [totals])
                continue
            scale = scales[0]
            del chunk.works
            assert chunk.out_grad is not None
            out_grad = chunk.out_grad * scale.view(-1, *([1] * (chunk.out_grad.dim() - 1)))
            if pass2 == "retain" and finite is None:
                assert chunk.out is not None
                grads = torch.autograd.grad(
                    chunk.out,
                    list(params.values()),
                    grad_outputs=out_grad,
                    allow_unused=True,
                    materialize_grads=True,
                )
            else:
                chunk.out = None  # free pass 1's graph before the second forward
                if finite is not None:  # only the rows with a finite norm
                    keep = finite.nonzero().squeeze(1)
                    if keep.numel() == 0:
                        continue
                    x, out_grad = x.index_select(0, keep), out_grad.index_select(0, keep)
                recorder.stop()
                with torch.enable_grad():
                    out = model(x)
                grads = torch.autograd.grad(
                    out,
                    list(params.values()),
                    grad_outputs=out_grad,
                    allow_unused=True,
                    materialize_grads=True,
                )
            with torch.no_grad():
                for name, g in zip(params, grads, strict=True):
                    totals.add(name, g)
    return totals.result(params)


@dataclass(frozen=True)
class GhostClipAggregator(MapAggregator):
    """Σ_i scale_i·g_i for a per-sample map, by ghost clipping / book-keeping.

    Same sum and the same sensitivity (the map's norm bound) as `PerSampleMapAggregator`, so the
    privacy analysis of the calling loop is unchanged; only the arithmetic differs. Raises
    ValueError for a model `supports` rejects (use PerSampleMapAggregator there). `precision`
    "bf16" runs the forward under bf16 autocast with float32 norms and sums; it needs pass2 "bk".
    """

    pass2: Pass2 = "bk"
    precision: Precision = "fp32"

    def __post_init__(self) -> None:
        if check_precision(self.precision) != "fp32" and self.pass2 != "bk":
            raise ValueError(f"pass2={self.pass2!r} is not offered with precision={self.precision!r}; use 'bk'")

    def sum_batch(self, model: nn.Module, X: torch.Tensor, y: torch.Tensor, context: BatchContext) -> TensorDict:
        return ghost_clipped_grad_sum(
            model,
            X,
            y,
            loss=context.loss,
            per_sample_map=self.per_sample_map,
            max_physical_batch_size=context.max_physical_batch_size,
            pass2=self.pass2,
            precision=self.precision,
        )


def ghost_weighted_grad_sums(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    per_sample_maps: Sequence[PerSampleMap],
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> list[dict[str, torch.Tensor]]:
    """Σ_i scale_k(||g_i||)·g_i for several maps k from ONE book-keeping pass.

    Result k equals ``ghost_clipped_grad_sum(..., per_sample_map=per_sample_maps[k], pass2="bk")``
    (same masking of rows with a non-finite norm): pass 1 and the norms are shared, only the
    per-layer weighted GEMMs are repeated. For algorithms that need several weightings of the
    same per-sample gradients (DiceSGD: the clipped sum and the clipping residual). Private
    results: release them through noise only. `precision` as for ghost_clipped_grad_sum (bk: bf16 allowed).
    """
    params = trainable_parameters(model)
    totals = [Totals() for _ in per_sample_maps]
    with Recorder(model, params) as recorder:
        chunking = _Chunking(params, loss, max_physical_batch_size, precision)
        chunks = _recorded_chunks(model, X, y, recorder, chunking, bk=True)
        for _, chunk in chunks:
            with torch.no_grad():
                scales, finite = _chunk_scales(
                    chunk.sq_norms, per_sample_maps, dtype=_dtype_of(params), terms=_norm_terms(params)
                )
                for work in chunk.works:  # every weighting from one read of each layer's tensors
                    work.accumulate(scales, finite, totals)
    return [total.result(params) for total in totals]


def iter_ghost_per_sample_grads(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_physical_batch_size: int,
    precision: Precision = "fp32",
) -> Iterator[dict[str, torch.Tensor]]:
    """Per-sample gradients chunk by chunk, name -> (m, *param.shape) in the trainable parameters'
    order: the same contract as `dp.per_example.per_sample.iter_per_sample_grads`, for models
    `supports` accepts.

    Each chunk costs one batched forward and one output-gradient backward (pass 1), then each
    layer's rule builds its rows' gradients from the recorded (a, δ) (one batched GEMM per
    layer for Linear and Conv), instead of the vmap engine's per-row autograd: for algorithms
    that need the gradients themselves, not only a weighted sum (DC-DPSGD projects every row's
    gradient). A parameter no recorded call reached gets zeros, as under vmap. Memory: m × the
    parameter count per chunk, as the vmap engine. The hooks are on the model only during each
    chunk's pass 1, so the caller may use the model between chunks and stop iterating early.
    Private: keep the gradients inside the worker.
    """
    params = trainable_parameters(model)
    chunks = iter_chunks(
        model, X, y, params=params, loss=loss, max_physical_batch_size=max_physical_batch_size, precision=precision
    )
    for spec, x, target in chunks:
        with Recorder(model, params) as recorder:
            chunk = pass1(
                model,
                recorder,
                x,
                target,
                spec,
                bk=True,  # the clipped sum's choice of form; a Gram-form layer builds its rows on demand
                want_out_grad=False,
                retain_graph=False,
                precision=precision,
            )
        rows = x.shape[0]
        with torch.no_grad():  # not around the yield: the caller's grad mode stays its own
            grads: dict[str, torch.Tensor] = {}
            for work in chunk.works:
                grads.update(work.per_sample())
            del chunk
            per_sample = {  # a rule may hand a parameter's rows in another layout of the same size (ViT token)
                name: grads.pop(name).reshape(rows, *p.shape) if name in grads else p.new_zeros((rows, *p.shape))
                for name, p in params.items()
            }
        yield per_sample
        del per_sample
