"""Ghost rule for the weight-standardised convolution (`privtrain_common.zoo.architectures.WSConv2d`).

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
not standardised: its gradient is Σ_t δ_iot as for a conv.

Floating point (dp/per_example/clip_margin.py): the subtraction can cancel, so the squared norm
used to clip is an upper bound on ||M̂ G'||², M̂ the map `_project` applies with the computed ŵ
(whose 1ᵀŵ is not exactly 0): for x = G'_io, α = 1ᵀx, β = ŵ_oᵀx and ĉ = ||ŵ_o||²/k,

    ||M̂ x||² = ||x||² − α²/k − (2 − ĉ)β²/k + 2αβ(1ᵀŵ_o)/k²      (exactly, for any ŵ_o),

and the rule takes ||x||² from above (the conv rule's float64 value, raised by its relative error
bound 2(O·k + 2)u), α² and β² from below (their float64 values less a bound e on their rounding) and the
cross term from above. α and β are formed in float64: from G' when the conv rule materialised it
(e ≤ 2k·u·Σ|terms|, u = 2⁻⁵³), else from float64 convolutions of the input (patch sums, the
convolution with ŵ) and the scaled output gradients, with e ≤ γ'·Σ_t |δ'_iot|·||a_it||₁ and γ'
= 1024·4(k + T + 2)·u: the factor 1024 covers convolution algorithms (Winograd, FFT) whose error
constants exceed a dot product's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dp.per_example.ghost.linear_conv import _conv_input, _input_dims, conv_work
from dp.per_example.ghost.registry import ghost_layer
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, Totals
from privtrain_common.zoo.architectures import WSConv2d

__all__ = ["standardisation_vjp", "standardised_conv_work"]


_U64 = 2.0**-53
"""float64's unit roundoff."""


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
    module: WSConv2d, a: torch.Tensor, w_hat: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per call: s (B, g, T), each group's input-patch sums (the same for every output channel of
    the group), and z (B, O, T), the convolution with ŵ (no bias; None without ŵ), in a's dtype."""
    batch, groups = a.shape[0], module.groups
    x, padding = _conv_input(module, a)
    geometry = {"stride": module.stride, "padding": padding, "dilation": module.dilation}
    z = None
    if w_hat is not None:
        z = F.conv2d(x, w_hat.reshape(module.weight.shape).to(x.dtype), None, groups=groups, **geometry)
        z = z.reshape(batch, module.out_channels, -1)
    summed = x.reshape(batch, groups, -1, *x.shape[2:]).sum(dim=2)  # (B, g, H, W)
    ones = torch.ones(groups, 1, *module.kernel_size, dtype=x.dtype, device=x.device)
    s = F.conv2d(summed, ones, None, groups=groups, **geometry)  # (B, g, H', W')
    return s.reshape(batch, groups, -1), z


def _projection_terms(
    module: WSConv2d, scaled: Calls, w_hat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(α, β, V), each (B, O) in float64, from the calls' inputs and scaled output gradients
    without G': α = 1ᵀG'_io = Σ_t δ'_iot s_it, β = ŵ_oᵀG'_io = Σ_t δ'_iot z_iot, and V = Σ_t |δ'_iot|·||a_it||₁
    (what their rounding errors are bounded by). Convolutions in float64: a box filter for the patch
    sums s (and of |x| for the patch ℓ1 norms), one with ŵ for z."""
    alpha = beta = spread = None
    w64 = w_hat.to(torch.float64)
    for a, d_scaled in scaled:
        batch, groups = d_scaled.shape[0], module.groups
        x64 = a.to(torch.float64)
        s, z = _patch_sums_and_outputs(module, x64, w64)
        l1, _ = _patch_sums_and_outputs(module, x64.abs(), None)
        assert z is not None
        flat_d = d_scaled.reshape(batch, module.out_channels, -1).to(torch.float64)
        by_group = flat_d.view(batch, groups, module.out_channels // groups, -1)
        a_part = torch.matmul(by_group, s.unsqueeze(-1)).reshape(batch, module.out_channels)
        b_part = torch.matmul(flat_d.unsqueeze(2), z.unsqueeze(-1)).reshape(batch, module.out_channels)
        v_part = torch.matmul(by_group.abs(), l1.unsqueeze(-1)).reshape(batch, module.out_channels)
        del s, z, l1, x64
        alpha = a_part if alpha is None else alpha + a_part
        beta = b_part if beta is None else beta + b_part
        spread = v_part if spread is None else spread + v_part
    assert alpha is not None and beta is not None and spread is not None
    return alpha, beta, spread


def _materialised_terms(
    flat: torch.Tensor, w_hat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(α, β) of the materialised G' (B, O, k) in float64, and bounds on their rounding (γ_k times
    the sums of absolute terms), a block of rows at a time (float64 copies stay small)."""
    k = w_hat.shape[1]
    w64 = w_hat.to(torch.float64)
    gamma = 2.0 * k * _U64
    parts = []
    rows = max(1, (1 << 22) // max(1, flat.shape[1] * k))
    for start in range(0, flat.shape[0], rows):
        block = flat[start : start + rows].to(torch.float64)
        weighted = block * w64
        parts.append(
            torch.stack(
                [
                    block.sum(dim=2),
                    weighted.sum(dim=2),
                    gamma * block.abs().sum(dim=2),
                    gamma * weighted.abs().sum(dim=2),
                ]
            )
        )
    alpha, beta, e_alpha, e_beta = torch.cat(parts, dim=1)
    return alpha, beta, e_alpha, e_beta


def _correction_lower_bound(
    alpha: torch.Tensor,
    beta: torch.Tensor,
    e_alpha: torch.Tensor,
    e_beta: torch.Tensor,
    w_hat: torch.Tensor,
) -> torch.Tensor:
    """A lower bound on Σ_o α²/k + (2 − ĉ_o)β²/k − 2αβ(1ᵀŵ_o)/k² per row (float64), given
    |α̃ − α| ≤ e_alpha and |β̃ − β| ≤ e_beta: (B, O) inputs, ŵ (O, k) as `_project` uses it."""
    k = w_hat.shape[1]
    w64 = w_hat.to(torch.float64)
    slack = 2.0 * k * _U64  # the float64 sums over k values below: relative error ≤ γ_k
    c_hat = w64.square().sum(dim=1) / k  # (O,)
    one_w = w64.sum(dim=1).abs() + slack * w64.abs().sum(dim=1)  # ≥ |1ᵀŵ_o|
    alpha_low = (alpha.abs() - e_alpha).clamp_min(0.0)
    beta_low = (beta.abs() - e_beta).clamp_min(0.0)
    b = 2.0 - c_hat * (1.0 + slack)  # ≤ 2 − ĉ
    beta_term = torch.where(b >= 0, b * beta_low.square(), b * (beta.abs() + e_beta).square())
    cross = 2.0 * (alpha.abs() + e_alpha) * (beta.abs() + e_beta) * one_w / (k * k)
    lower = alpha_low.square() / k + beta_term / k - cross
    # The few float64 operations of this formula round too: shrink the (positive part of the) bound.
    return torch.where(lower > 0, lower * (1.0 - 8.0 * slack), lower * (1.0 + 8.0 * slack)).sum(dim=1)


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
            scaled = [(a, d * inv_std.view(1, -1, 1, 1).to(d.dtype)) for a, d in calls]
            effective = conv_work(module, {"weight": weight_name, "bias": None}, scaled, bk=bk)
            if effective.holds_per_sample:  # G' at hand: both terms are O(O·k) per row
                flat = effective.per_sample()[weight_name].reshape(-1, *w_hat.shape)  # (B, O, k)
                alpha, beta, e_alpha, e_beta = _materialised_terms(flat, w_hat)
            else:
                alpha, beta, spread = _projection_terms(module, scaled, w_hat)
                positions = sum(d.shape[-1] * d.shape[-2] for _, d in calls)
                gamma = 1024.0 * 4.0 * (k + positions + 2) * _U64
                e_alpha = gamma * spread
                e_beta = gamma * spread * w_hat.to(torch.float64).abs().amax(dim=1)
            # ||G'||² from above: the conv rule's float64 value is within a float64 sum's relative
            # error of its O·k squares, or above it already.
            x_squared = effective.sq_norms * (1.0 + 2.0 * (w_hat.numel() + 2) * _U64)
            sq = (x_squared - _correction_lower_bound(alpha, beta, e_alpha, e_beta, w_hat)).clamp_min(0.0)

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
