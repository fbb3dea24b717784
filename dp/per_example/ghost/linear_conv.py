"""Ghost rules for Linear, Conv1d and Conv2d: g_i = Σ_t δ_it a_itᵀ over positions t (per group).

- Linear, 2-D input: g_i = δ_i a_iᵀ, ||g_i||² = ||a_i||²·||δ_i||² (+ bias ||δ_i||²): O(d) per row.
- Linear on (B, T, d) and Conv1d/Conv2d (unfolded to patches, per group): g_i = Σ_t δ_it a_itᵀ.
  Either the Gram ("ghost") form ||g_i||² = Σ_{t,t'} (a_it·a_it')(δ_it·δ_it') — O(T²(d+p)) per
  row, no per-sample gradient — or the materialised per-sample gradient — O(T·d·p) per row and
  B·d·p memory, but its weighted sum is then a cheap tensordot. `_use_gram` picks per call from
  the shapes: flops, plus a per-device cost of every value a form writes (WRITE_COST_FLOPS), with
  a memory cap on materialisation. Conv gradients are materialised
  by im2col (one copy of a strided window of the input) + batched GEMM.
A layer called several times in one forward (weights reused) is exact too: its calls are stacked
along the position axis. The weighted sum (book-keeping) is (s·δ)ᵀa — one GEMM per layer; for a
conv in the Gram form, the device's own batch weight-gradient kernel on (input, s·δ), which never
builds the patches and costs what the non-private backward's weight gradient costs — or a
tensordot of the scales with the materialised per-sample gradients.

Numerics: the factorised 2-D Linear form and the materialised forms have the same O(eps)
relative rounding as the vmap engine. The Gram form sums T² terms of both signs, so for a row
whose gradient is much smaller than Σ_t ||a_t||·||δ_t|| (cancellation across positions) its
squared norm carries an absolute error up to about eps·(Σ_t ||a_t||·||δ_t||)² — in the worst case
a relative error growing like eps·T, not eps. An underestimated norm lets a clipped row exceed
the bound by that relative amount (the float slack discussed in
dp/per_example/per_sample_maps.py, larger here). The Gram form is chosen where materialising
would exceed MATERIALISE_MAX_ELEMENTS or cost more; at the zoo's shapes that is layers with few
positions and many weights per row (wrn 16-4 and resnet-gn on 8×8 and 4×4 maps, cnn3's third
conv on 8×8, cnn2-gn's second conv at T = 25, the ViT's and the transformer classifier's Linear
layers at T = 65 and 64), so
T ≤ 65 there and the worst-case relative error stays below about 65·2⁻²⁴ ≈ 4e-6. The clamp at 0
keeps a rounded Gram sum a valid square.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dp.per_example.clip_margin import gram_allowance
from dp.per_example.ghost.registry import ghost_layer, rows_on_dim0
from dp.per_example.ghost.work import (
    MATERIALISE_MAX_ELEMENTS,
    WRITE_COST_FLOPS,
    Accumulate,
    Calls,
    LayerWork,
    ParamNames,
    Totals,
    masked_rows,
    squared_norm,
)

__all__ = ["WRITE_COST_FLOPS", "RowBlocks", "conv_work", "dense_calls_work", "linear_work"]

# Per-sample conv weight gradients are materialised by im2col (a copied window) + batched GEMM.
# An einsum over the uncopied strided window view was used on CPU for layers with fewer patch
# features than positions until the wrn 16-4 profile showed its implied transposing copy 2-3x
# slower than the window copy, for every zoo layer shape measured (docs/benchmarks.md). Folding
# the batch into the groups of one weight-gradient convolution was also tried: on CPU its oneDNN
# timings varied 1x-5x from run to run, so it is not used.

PATCH_BLOCK_ELEMENTS = 1 << 22
"""Patch-matrix values (16 MiB in float32) built at once, rows in blocks: for materialised per-sample
conv gradients and for the Gram form's norms. 2^24 (64 MiB) made the block the
largest transient of a wrn 16-4 step at B = 32 (docs/benchmarks.md#peak-memory-of-the-ghost-engine)."""


def _use_gram(
    batch: int,
    groups: int,
    positions: int,
    k: int,
    o: int,
    *,
    bk: bool,
    device_type: str = "cpu",
    patches: bool = False,
    patch_sum: bool = True,
) -> bool:
    """Gram form (True) or materialised per-sample gradients (False) for a (positions × k) →
    (positions × o) map per group: compare per-row flops plus the device's cost of the values
    each form writes, and cap the materialised memory. `patches`: the inputs per position are a
    conv's patches, written (T·k values per row) once to materialise and, in the Gram form, once
    for the norms and, when `patch_sum`, again for the weighted sum (`RowBlocks`; a conv's Gram
    form sums with its own weight-gradient kernel instead, which writes no patches)."""
    t, g = positions, groups
    write = WRITE_COST_FLOPS.get(device_type, 0)
    patch_values = t * k if patches else 0
    gram_patch_writes = (2 if bk and patch_sum else 1) * patch_values
    mat_flops = t * o * k + (o * k if bk else 0) + write * (o * k + patch_values)
    gram_flops = t * t * (k + o) + (t * o * k if bk else 0) + write * (2 * t * t + gram_patch_writes)
    mat_mem, gram_mem = batch * g * o * k, batch * g * t * t
    if mat_flops <= gram_flops:
        return mat_mem > MATERIALISE_MAX_ELEMENTS and gram_mem < mat_mem
    return not (gram_mem > MATERIALISE_MAX_ELEMENTS and mat_mem < gram_mem)


def _weighted_outer_sums(sd: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Σ_{i,t} sd_jit a_itᵀ per weighting j and group: (m, B, g, T, o), (B, g, T, k) -> (m, g, o, k).
    One GEMM for all m: the m weightings are stacked along the output features, so a is read once."""
    m, batch, groups, positions, o = sd.shape
    k = a.shape[-1]
    if groups == 1:
        stacked = sd.reshape(m, batch * positions, o).permute(1, 0, 2).reshape(batch * positions, m * o)
        return (stacked.T @ a.reshape(batch * positions, k)).reshape(m, 1, o, k)
    return torch.einsum("mbgto,bgtk->mgok", sd, a)


# weighted_sums(weights (m, B), row_mask) -> m sums Σ_i weights_ji·g_i of the layer's weight
# (rows outside the mask contribute exactly 0), each in any shape with the weight's numel.
WeightedSums = Callable[[torch.Tensor, torch.Tensor | None], Sequence[torch.Tensor]]


@dataclass(frozen=True)
class RowBlocks:
    """The Gram form's per-position inputs A (B, g, T, k), handed out a block of rows at a time.

    A Linear layer's A is its input, kept whole (one block, no copy). A conv layer's A is its
    input patches, ∏kernel times the input (9× for a 3×3 conv): the work keeps the raw input and
    rebuilds the patches of `rows_per_block` rows at a time (PATCH_BLOCK_ELEMENTS values) for the
    norms (its weighted sum reads the input itself: `_conv_weight_grad`), so no more than one
    block of patches ever exists.
    """

    batch: int
    rows_per_block: int
    take: Callable[[int, int], torch.Tensor]  # (start, stop) -> A[start:stop]

    @staticmethod
    def whole(A: torch.Tensor) -> RowBlocks:
        return RowBlocks(A.shape[0], max(1, A.shape[0]), lambda start, stop: A[start:stop])

    def spans(self) -> list[tuple[int, int]]:
        step = self.rows_per_block
        return [(start, min(start + step, self.batch)) for start in range(0, self.batch, step)]


def _gram_squared_norms(A: RowBlocks, D: torch.Tensor) -> torch.Tensor:
    """An upper bound on Σ_{t,t'} (a_t·a_t')(δ_t·δ_t') per row, block by block: (B,) float64.

    The inner products are formed in float64 from the float32 (a, δ), and the bound on their
    rounding (`gram_allowance`, from W = Σ_t ‖a_t‖·‖δ_t‖ per group) is added: the sum of T² terms
    of both signs may cancel, so only an upper bound is safe to clip with."""
    terms = []
    for start, stop in A.spans():
        block = A.take(start, stop).to(torch.float64)
        aat = torch.matmul(block, block.transpose(-1, -2))  # (b, g, T, T)
        d = D[start:stop].to(torch.float64)
        ddt = torch.matmul(d, d.transpose(-1, -2))
        weights = (torch.linalg.vector_norm(block, dim=-1) * torch.linalg.vector_norm(d, dim=-1)).sum(dim=-1)
        groups, positions = block.shape[1], block.shape[2]
        count = block.shape[-1] + d.shape[-1] + groups * positions * positions + 3
        del block
        gram = torch.linalg.vecdot(aat.flatten(1), ddt.flatten(1)).clamp_min(0.0)
        terms.append(gram + gram_allowance(weights, terms=count).sum(dim=-1))
    return terms[0] if len(terms) == 1 else torch.cat(terms)


def _positional_work(
    weight_name: str | None,
    bias_name: str | None,
    weight_shape: torch.Size,
    D: torch.Tensor,
    *,
    A: RowBlocks | None = None,
    G: torch.Tensor | None = None,
    weighted_sums: WeightedSums | None = None,
) -> LayerWork:
    """Linear/Conv rule. D: (B, g, T, o) output gradients per group and position. For the weight
    (if trainable) exactly one of A: the (B, g, T, k) inputs per position, in row blocks (Gram
    form; T = 1 is the ||a||²·||δ||² case) or G: (B, g, o, k) materialised per-sample gradients.
    With A, `weighted_sums` (a conv's own weight-gradient kernel) may replace the GEMM on A's blocks.

    Per-sample weight gradient of group j: G_ij = Σ_t D_ijt A_ijtᵀ (o × k); bias: Σ_t D_ijt.
    """
    batch, groups, positions, _ = D.shape
    terms: list[torch.Tensor] = []
    parts: list[Accumulate] = []
    # Each branch's closures capture only what that branch keeps (a closure referring to D would
    # keep the output gradients alive next to G).
    rows: list[Callable[[], tuple[str, torch.Tensor]]] = []

    if bias_name is not None:
        gb = D.sum(dim=2).reshape(batch, -1)  # (B, g·o) = (B, C_out)
        terms.append(squared_norm(gb, 1))

        def add_bias(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
            for total, s in zip(totals, w @ masked_rows(mask, gb), strict=True):
                total.add(bias_name, s)

        parts.append(add_bias)
        rows.append(lambda: (bias_name, gb))

    if weight_name is not None and G is not None:
        terms.append(squared_norm(G, 3))

        def add_weight(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
            sums = torch.tensordot(w, masked_rows(mask, G), dims=1)  # (m, g, o, k): G read once
            for total, s in zip(totals, sums, strict=True):
                total.add(weight_name, s.reshape(weight_shape))

        parts.append(add_weight)
        rows.append(lambda: (weight_name, G.reshape(batch, *weight_shape)))
    elif weight_name is not None:
        assert A is not None
        if positions == 1:
            # ||δ aᵀ||² = ||a||²·||δ||²: no per-sample gradient, O(k + o) per row.
            whole = A.take(0, batch)
            terms.append(
                (squared_norm(whole, 3) * squared_norm(D, 3))
                if groups == 1
                else (squared_norm(whole, 1) * squared_norm(D, 1)).sum(dim=(1, 2))
            )
            del whole
        else:  # Gram form: Σ_{t,t'} (a_t·a_t')(δ_t·δ_t')
            terms.append(_gram_squared_norms(A, D))

        def add_weight_gram(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
            if weighted_sums is not None:
                for total, s in zip(totals, weighted_sums(w, mask), strict=True):
                    total.add(weight_name, s.reshape(weight_shape))
                return
            sums: torch.Tensor | None = None
            for start, stop in A.spans():
                rows = None if mask is None else mask[start:stop]
                sd = masked_rows(rows, D[start:stop]).unsqueeze(0) * w[:, start:stop].reshape(w.shape[0], -1, 1, 1, 1)
                part = _weighted_outer_sums(sd, masked_rows(rows, A.take(start, stop)))
                sums = part if sums is None else sums.add_(part)
            assert sums is not None
            for total, s in zip(totals, sums, strict=True):
                total.add(weight_name, s.reshape(weight_shape))

        def weight_rows() -> tuple[str, torch.Tensor]:  # G_ij = Σ_t D_ijt A_ijtᵀ, built on demand
            assert A is not None
            parts = [torch.matmul(D[start:stop].transpose(-1, -2), A.take(start, stop)) for start, stop in A.spans()]
            G = parts[0] if len(parts) == 1 else torch.cat(parts)
            return weight_name, G.reshape(batch, *weight_shape)

        parts.append(add_weight_gram)
        rows.append(weight_rows)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        for part in parts:
            part(w, mask, totals)

    def per_sample() -> dict[str, torch.Tensor]:
        return dict(row() for row in rows)

    sq = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return LayerWork(sq, accumulate, per_sample, holds_per_sample=weight_name is None or G is not None)


def _dense_work(weight_name: str | None, bias_name: str | None, a: torch.Tensor, d: torch.Tensor) -> LayerWork:
    """Linear on (B, k) rows, called once: ||g_i||² = ||δ_i||²·(||a_i||² + 1) with a bias,
    and the clipped sum is (s·δ)ᵀa, Σ s·δ — the fast path of `_positional_work` (fewer ops)."""
    sq = squared_norm(d, 1)  # float64: a bounded relative error (dp/per_example/clip_margin.py)
    if weight_name is not None:
        sq_a = squared_norm(a, 1)
        sq = sq * (sq_a + 1.0) if bias_name is not None else sq * sq_a

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        m, (batch, o) = w.shape[0], d.shape
        # (B, m·o): each row's m weightings of δ side by side, made in this layout (no transposing
        # copy), so one GEMM reads a once for all of them
        sd = (masked_rows(mask, d).unsqueeze(1) * w.T.contiguous().unsqueeze(2)).reshape(batch, m * o)
        if weight_name is not None:
            weights = (sd.T @ masked_rows(mask, a)).view(m, o, -1)
            for j, total in enumerate(totals):
                total.add(weight_name, weights[j])
        if bias_name is not None:
            biases = sd.sum(dim=0).view(m, o)
            for j, total in enumerate(totals):
                total.add(bias_name, biases[j])

    def per_sample() -> dict[str, torch.Tensor]:
        grads = {}
        if weight_name is not None:
            grads[weight_name] = d.unsqueeze(2) * a.unsqueeze(1)  # δ_i a_iᵀ: (B, o, k)
        if bias_name is not None:
            grads[bias_name] = d
        return grads

    return LayerWork(sq, accumulate, per_sample)


def _grouped_work(
    names: ParamNames,
    weight_shape: torch.Size,
    D: torch.Tensor,
    *,
    k: int,
    bk: bool,
    per_sample_grads: Callable[[], torch.Tensor],
    inputs: Callable[[], RowBlocks],
    patches: bool = False,
    weighted_sums: WeightedSums | None = None,
) -> LayerWork:
    """Pick the form for D (B, g, T, o): bias only, materialised G (B, g, o, k) from
    `per_sample_grads`, or the Gram/factorised form on the inputs (B, g, T, k) from `inputs`
    (`patches`: built from a conv's input, see `_use_gram`; `weighted_sums`: the Gram form's
    weighted sum without the inputs per position)."""
    batch, groups, positions, o = D.shape
    weight, bias = names["weight"], names["bias"]
    if weight is None:  # bias only: the inputs are never needed
        return _positional_work(None, bias, weight_shape, D)
    use_gram = _use_gram(
        batch,
        groups,
        positions,
        k,
        o,
        bk=bk,
        device_type=D.device.type,
        patches=patches,
        patch_sum=weighted_sums is None,
    )
    if positions > 1 and not use_gram:
        return _positional_work(weight, bias, weight_shape, D, G=per_sample_grads())
    return _positional_work(weight, bias, weight_shape, D, A=inputs(), weighted_sums=weighted_sums)


@ghost_layer(nn.Linear)
def linear_work(module: nn.Linear, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """Linear on (B, k) rows or (B, *, k) sequences; the calls of a reused layer are stacked."""
    return dense_calls_work(names, calls, out_features=module.out_features, in_features=module.in_features, bk=bk)


def dense_calls_work(names: ParamNames, calls: Calls, *, out_features: int, in_features: int, bk: bool) -> LayerWork:
    """The rule of y = x Wᵀ + b with W of shape (out_features, in_features), on (B, k) rows or
    (B, *, k) sequences: per-sample weight gradients in W's (out, in) layout. For any layer that
    computes this map (Linear; GPT-2's Conv1D, whose weight is Wᵀ, transposes the result)."""
    batch = calls[0][0].shape[0]
    if len(calls) == 1 and calls[0][0].dim() == 2:
        return _dense_work(names["weight"], names["bias"], calls[0][0], calls[0][1])
    o, k = out_features, in_features
    Ds = [d.reshape(batch, 1, -1, o) for _, d in calls]
    D = Ds[0] if len(Ds) == 1 else torch.cat(Ds, dim=2)

    def per_sample_grads() -> torch.Tensor:
        A = torch.cat([a.reshape(batch, 1, -1, k) for a, _ in calls], dim=2)
        return torch.matmul(D.transpose(-1, -2), A)

    def inputs() -> RowBlocks:
        As = [a.reshape(batch, 1, -1, k) for a, _ in calls]
        return RowBlocks.whole(As[0] if len(As) == 1 else torch.cat(As, dim=2))

    return _grouped_work(names, torch.Size((o, k)), D, k=k, bk=bk, per_sample_grads=per_sample_grads, inputs=inputs)


def _conv_input(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The input as the convolution sees it, and the padding still to apply (zeros)."""
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        a = F.pad(a, module._reversed_padding_repeated_twice, mode=mode)
        return a, (0,) * len(module.kernel_size)
    return a, tuple(module.padding)


def _conv_window(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, spatial: Sequence[int]) -> torch.Tensor:
    """A view (B, C_in, *kernel, *out_spatial) of the padded input: the patches, without a copy."""
    x, padding = _conv_input(module, a)
    if any(padding):
        x = F.pad(x, [q for q in reversed(padding) for _ in range(2)])
    x = x.contiguous()
    sb, sc, *ss = x.stride()
    return x.as_strided(
        (x.shape[0], x.shape[1], *module.kernel_size, *spatial),
        (
            sb,
            sc,
            *(st * dl for st, dl in zip(ss, module.dilation, strict=True)),
            *(st * sd for st, sd in zip(ss, module.stride, strict=True)),
        ),
    )


def _conv_patches(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, spatial: Sequence[int]) -> torch.Tensor:
    """Unfolded input patches (B, C_in·∏kernel, positions), matching the weight's layout: F.unfold's
    matrix, made by one copy of the strided window. (CUDA's F.unfold launches one im2col kernel per
    row: at B = 1024 those launches took two thirds of a DP step's GPU time on a 3-conv net; on a
    CPU the copy is as fast or faster, docs/benchmarks.md.)"""
    window = _conv_window(module, a, spatial)
    return window.reshape(a.shape[0], window.shape[1] * math.prod(module.kernel_size), math.prod(spatial))


def _conv_per_sample_grads(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Per-sample weight gradients (B, g, o, k) of one call, built PATCH_BLOCK_ELEMENTS of patch
    matrix at a time: the patches are a transient T·k values per row (a 3×3 conv on 32×32 maps:
    9× its input), so a whole chunk's at once set the peak memory of a wide first layer's work."""
    batch, per_row = a.shape[0], module.weight[0].numel() * module.groups * math.prod(d.shape[2:])
    rows = max(1, PATCH_BLOCK_ELEMENTS // per_row)
    if rows >= batch:
        return _conv_per_sample_grads_block(module, a, d)
    g = module.groups
    G = a.new_empty(batch, g, module.out_channels // g, module.weight[0].numel())
    for start in range(0, batch, rows):
        G[start : start + rows] = _conv_per_sample_grads_block(module, a[start : start + rows], d[start : start + rows])
    return G


def _conv_per_sample_grads_block(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """`_conv_per_sample_grads` for rows whose patches fit one block."""
    batch, g = a.shape[0], module.groups
    o = module.out_channels // g
    spatial = d.shape[2:]
    patches = _conv_patches(module, a, spatial)  # (B, g·k, T)
    with _matmuls_as_precise_as_convolutions(a):
        return torch.matmul(d.reshape(batch, g, o, -1), patches.view(batch, g, -1, patches.shape[-1]).transpose(-1, -2))


def _cuda_float32(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and t.dtype == torch.float32


@contextlib.contextmanager
def _cuda_float32_flag(t: torch.Tensor, backend: Any, value: bool) -> Iterator[None]:  # torch.backends' flag modules
    """`backend.allow_tf32` set to `value` while this runs, for float32 work on CUDA only (and only
    where it differs), then put back as it was. Elsewhere the flags are not even read."""
    if not _cuda_float32(t) or backend.allow_tf32 == value:
        yield
        return
    saved = backend.allow_tf32
    backend.allow_tf32 = value
    try:
        yield
    finally:
        backend.allow_tf32 = saved


def _matmuls_as_precise_as_convolutions(t: torch.Tensor) -> contextlib.AbstractContextManager[None]:
    """Materialised per-sample conv gradients at the precision of the model's own convolutions.

    On CUDA, cuDNN runs a float32 model's convolutions (the non-private weight gradient included)
    in TF32 unless the process turned that off, while matrix products default to full float32: the
    batched GEMMs that build G_i would run at a fraction of the tensor cores' rate. They take cuDNN's
    setting. Sound: in the materialised form a row's norm and its share of the sum both come from
    this one G_i, so ||scale_i·G_i|| ≤ C holds however G_i was rounded (unlike the Gram form, whose
    norm and sum are separate computations and stay float32: `_ieee_float32_convolutions`)."""
    if not _cuda_float32(t) or not torch.backends.cudnn.allow_tf32:
        return contextlib.nullcontext()
    return _cuda_float32_flag(t, torch.backends.cuda.matmul, True)


def _ieee_float32_convolutions(t: torch.Tensor) -> contextlib.AbstractContextManager[None]:
    """cuDNN convolutions in full float32 while this runs: by default they round float32 inputs to
    TF32 (10-bit mantissa), and a clipped sum must be float32 like every other sum of the engine
    (a TF32 sum's rounding error, about 1e-3 of the sum, is data-dependent and not small beside C).
    Through cuDNN's process-wide TF32 flag, the one setting every PyTorch version reads the same."""
    return _cuda_float32_flag(t, torch.backends.cudnn, False)


def _conv_weight_grad(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Σ_i Σ_t d_it a_itᵀ: the batch weight gradient of the convolution, by the device's own kernel
    (cuDNN, oneDNN), which reads the input in place of its patches. ``d`` may carry m weightings
    stacked in each group's output channels (B, g·m·o, *spatial): the gradient is then
    (g·m·o, C/g, *kernel), m sums from one read of the input."""
    x, padding = _conv_input(module, a)
    weight_shape = (d.shape[1], *module.weight.shape[1:])
    weight = d.new_empty(1).expand(weight_shape)  # only its shape and dtype are read
    no_bias, not_transposed, no_output_padding = None, False, [0] * len(padding)
    with _ieee_float32_convolutions(d):
        grad: torch.Tensor = torch.ops.aten.convolution_backward(
            d,
            x,
            weight,
            no_bias,
            list(module.stride),
            list(padding),
            list(module.dilation),
            not_transposed,
            no_output_padding,
            module.groups,
            [False, True, False],  # the weight's gradient only
        )[1]
    return grad


def _input_dims(dims: int) -> Callable[[nn.Module, torch.Tensor, torch.Tensor, int], bool]:
    """A call check for a conv layer: rows on dimension 0 and exactly `dims` input dimensions."""

    def keeps_rows(module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
        return rows_on_dim0(module, inp, out, batch) and inp.dim() == dims

    return keeps_rows


@ghost_layer(nn.Conv1d, keeps_rows=_input_dims(3))
@ghost_layer(nn.Conv2d, keeps_rows=_input_dims(4))
def conv_work(module: nn.Conv1d | nn.Conv2d, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """Conv1d/Conv2d on (B, C, *spatial), per group; the calls of a reused layer are stacked."""
    batch = calls[0][0].shape[0]
    g = module.groups
    o = module.out_channels // g
    k = module.weight[0].numel()
    Ds = [d.reshape(batch, g, o, -1).transpose(-1, -2) for _, d in calls]  # (B, g, T, o)
    D = Ds[0] if len(Ds) == 1 else torch.cat(Ds, dim=2)

    def per_sample_grads() -> torch.Tensor:
        G = _conv_per_sample_grads(module, calls[0][0], calls[0][1])
        for a, d in calls[1:]:
            G = G + _conv_per_sample_grads(module, a, d)
        return G

    raw = [a for a, _ in calls]  # the Gram form keeps the inputs, not their patches
    spatial = [d.shape[2:] for _, d in calls]

    def patches(start: int, stop: int) -> torch.Tensor:
        As = []
        for a, out_spatial in zip(raw, spatial, strict=True):
            block = _conv_patches(module, a[start:stop], out_spatial)
            As.append(block.view(stop - start, g, k, -1).transpose(-1, -2))  # (b, g, T, k)
        return As[0] if len(As) == 1 else torch.cat(As, dim=2)

    def inputs() -> RowBlocks:
        per_row = g * k * D.shape[2]
        return RowBlocks(batch, max(1, PATCH_BLOCK_ELEMENTS // per_row), patches)

    def weighted_sums(w: torch.Tensor, mask: torch.Tensor | None) -> list[torch.Tensor]:
        """The m weightings stacked in each group's output channels: one kernel reads a once."""
        m = w.shape[0]
        total: torch.Tensor | None = None
        for a, d in calls:
            rows, spatial_dims = d.shape[0], d.dim() - 2
            by_group = masked_rows(mask, d).reshape(rows, g, 1, o, *d.shape[2:])
            scales = w.T.reshape(rows, 1, m, 1, *([1] * spatial_dims)).to(d.dtype)
            stacked = (by_group * scales).reshape(rows, g * m * o, *d.shape[2:])  # (B, g·m·o, *spatial)
            part = _conv_weight_grad(module, masked_rows(mask, a), stacked)
            total = part if total is None else total.add_(part)
        assert total is not None
        per_weighting = total.reshape(g, m, o, *total.shape[1:]).transpose(0, 1)  # (m, g, o, C/g, *kernel)
        return list(per_weighting.reshape(m, g * o, *total.shape[1:]).unbind(0))

    copied = math.prod(module.kernel_size) > 1  # a 1×1 kernel's patches are a view of its input
    return _grouped_work(
        names,
        module.weight.shape,
        D,
        k=k,
        bk=bk,
        per_sample_grads=per_sample_grads,
        inputs=inputs,
        patches=copied,
        weighted_sums=weighted_sums,
    )
