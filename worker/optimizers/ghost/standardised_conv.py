"""Ghost rule for the weight-standardised convolution (`privtrain.architectures.WSConv2d`).

The layer convolves with ŵ = (w − mean)/σ, σ = sqrt(var + eps), standardised per output channel
o over its fan-in (k values) from the raw parameter w. Row i's gradient w.r.t. the raw weight is
the standardisation's Jacobian transpose applied to its gradient w.r.t. ŵ, per output channel
(the same map as a LayerNorm's backward):

    g_io = M_o Ĝ_io / σ_o,   Ĝ_io = Σ_t δ_iot a_it,   M_o = I − 1·1ᵀ/k − ŵ_o ŵ_oᵀ/k

Exact without materialising anything the plain conv rule would not: with δ' = δ/σ_o the conv
rule (Gram or materialised form, its own choice) gives Σ_o ||G'_io||² for G'_io = Σ_t δ'_iot a_it,
and since 1 ⊥ ŵ_o and ||ŵ_o||² = c_o·k with c_o = var/(var + eps),

    ||M_o G'||² = ||G'||² − (1ᵀG')²/k − (2 − c_o)(ŵ_oᵀG')²/k

where, when the conv rule materialised G' (its own choice), 1ᵀG'_io and ŵ_oᵀG'_io are read off
it (O(O·k) per row); in the Gram form they are 1ᵀG'_io = Σ_t δ'_iot s_it (s_it: the sum of the
input patch at t, a box filter) and ŵ_oᵀG'_io = Σ_t δ'_iot z_iot (z: the convolution with ŵ, i.e.
the layer's output without bias, recomputed; O(positions × channels) per row beside that). The
weighted sum is linear, so M is applied once to the conv rule's Σ_i scale_i·G'_i. The bias is
not standardised: its gradient is Σ_t δ_iot as for a conv. The subtraction can cancel, so the
squared norm carries an absolute rounding error of about eps·||G'||², like the conv rule's Gram
form; it is clamped at 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from privtrain.architectures import WSConv2d
from worker.optimizers.ghost.linear_conv import _conv_input, _input_dims, conv_work
from worker.optimizers.ghost.registry import ghost_layer
from worker.optimizers.ghost.work import Calls, LayerWork, ParamNames, Totals

__all__ = ["standardisation_vjp", "standardised_conv_work"]


def _standardisation(weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ŵ, 1/σ) per output channel: (O, k) and (O, 1)."""
    flat = weight.detach().reshape(weight.shape[0], -1)
    mean = flat.mean(dim=1, keepdim=True)
    inv_std = torch.rsqrt(flat.var(dim=1, keepdim=True, unbiased=False) + eps)
    return (flat - mean) * inv_std, inv_std


def _project(w_hat: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """M_o x per output channel for x of shape (..., O, k)."""
    return grads - grads.mean(dim=-1, keepdim=True) - w_hat * (grads * w_hat).mean(dim=-1, keepdim=True)


def standardisation_vjp(weight: torch.Tensor, eps: float, grads: torch.Tensor) -> torch.Tensor:
    """Gradients w.r.t. the raw weight from gradients w.r.t. the standardised weight.

    weight: (O, *fan_in); grads: (*batch, O, *fan_in) -> the same shape.
    """
    with torch.no_grad():
        w_hat, inv_std = _standardisation(weight, eps)
        flat = grads.reshape(*grads.shape[: grads.dim() - weight.dim()], *w_hat.shape)
        return (_project(w_hat, flat) * inv_std).reshape(grads.shape)


def _patch_sums_and_outputs(
    module: WSConv2d, a: torch.Tensor, w_hat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per call: s (B, g, T), each group's input-patch sums (the same for every output channel of
    the group), and z (B, O, T), the convolution with ŵ (no bias)."""
    batch, groups = a.shape[0], module.groups
    x, padding = _conv_input(module, a)
    geometry = {"stride": module.stride, "padding": padding, "dilation": module.dilation}
    z = F.conv2d(x, w_hat.reshape(module.weight.shape).to(x.dtype), None, groups=groups, **geometry)
    summed = x.reshape(batch, groups, -1, *x.shape[2:]).sum(dim=2)  # (B, g, H, W)
    ones = torch.ones(groups, 1, *module.kernel_size, dtype=x.dtype, device=x.device)
    s = F.conv2d(summed, ones, None, groups=groups, **geometry)  # (B, g, H', W')
    return s.reshape(batch, groups, -1), z.reshape(batch, module.out_channels, -1)


def _projection_terms(module: WSConv2d, scaled: Calls, w_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1ᵀG'_io, ŵ_oᵀG'_io), each (B, O), from the calls' inputs and scaled output gradients
    without G': Σ_t δ'_iot s_it and Σ_t δ'_iot z_iot (z recomputed: a convolution with ŵ)."""
    ones_term = w_term = None
    for a, d_scaled in scaled:
        s, z = _patch_sums_and_outputs(module, a, w_hat)
        batch, groups = d_scaled.shape[0], module.groups
        flat_d = d_scaled.reshape(batch, module.out_channels, -1)
        # Σ_t δ'·s and Σ_t δ'·z as batched products: no (B, O, T) temporaries.
        by_group = flat_d.view(batch, groups, module.out_channels // groups, -1)
        ones_part = torch.matmul(by_group, s.unsqueeze(-1)).reshape(batch, module.out_channels)
        w_part = torch.matmul(flat_d.unsqueeze(2), z.unsqueeze(-1)).reshape(batch, module.out_channels)
        del s, z
        ones_term = ones_part if ones_term is None else ones_term + ones_part
        w_term = w_part if w_term is None else w_term + w_part
    assert ones_term is not None and w_term is not None
    return ones_term, w_term


@ghost_layer(WSConv2d, keeps_rows=_input_dims(4))
def standardised_conv_work(module: WSConv2d, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """The conv rule on δ/σ for ||G'||² and Σ scale·G', corrected by the standardisation's Jacobian."""
    weight_name, bias_name = names["weight"], names["bias"]
    works: list[LayerWork] = []
    if bias_name is not None:
        works.append(conv_work(module, {"weight": None, "bias": bias_name}, calls, bk=bk))
    if weight_name is not None:
        with torch.no_grad():
            w_hat, inv_std = _standardisation(module.weight, module.eps)
            k = w_hat.shape[1]
            c = w_hat.square().sum(dim=1) / k  # (O,)
            scaled = [(a, d * inv_std.view(1, -1, 1, 1).to(d.dtype)) for a, d in calls]
            effective = conv_work(module, {"weight": weight_name, "bias": None}, scaled, bk=bk)
            if effective.holds_per_sample:  # G' at hand: both terms are O(O·k) per row
                flat = effective.per_sample()[weight_name].reshape(-1, *w_hat.shape)  # (B, O, k)
                ones_term = flat.sum(dim=2)
                w_term = torch.linalg.vecdot(flat, w_hat.to(flat.dtype))
            else:
                ones_term, w_term = _projection_terms(module, scaled, w_hat)
            correction = (ones_term.square() + (2.0 - c) * w_term.square()).sum(dim=1) / k
            sq = (effective.sq_norms - correction).clamp_min(0.0)

        def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
            own = [Totals() for _ in totals]
            effective.accumulate(w, mask, own)
            for total, mine in zip(totals, own, strict=True):
                summed = mine.sums[weight_name].reshape(w_hat.shape)
                total.add(weight_name, _project(w_hat.to(summed.dtype), summed).reshape(module.weight.shape))

        def per_sample() -> dict[str, torch.Tensor]:
            scaled_grads = effective.per_sample()[weight_name]  # G'_i: (B, *weight shape)
            batch = scaled_grads.shape[0]
            flat = scaled_grads.reshape(batch, *w_hat.shape)
            return {weight_name: _project(w_hat.to(flat.dtype), flat).reshape(scaled_grads.shape)}

        works.append(LayerWork(sq, accumulate, per_sample))

    def accumulate_all(w: torch.Tensor, mask: torch.Tensor | None, totals: Sequence[Totals]) -> None:
        for work in works:
            work.accumulate(w, mask, totals)

    def per_sample_all() -> dict[str, torch.Tensor]:
        return {name: g for work in works for name, g in work.per_sample().items()}

    sq_total = works[0].sq_norms if len(works) == 1 else works[0].sq_norms + works[1].sq_norms
    return LayerWork(sq_total, accumulate_all, per_sample_all)
