"""Ghost clipping / book-keeping: Σ_i scale_i·g_i without a per-sample gradient for every parameter.

Same contract as `worker.optimizers.per_sample.clipped_grad_sum` (read its docstring): the
result is Σ_i scale_i·g_i with scale_i = per_sample_map.scale_factors(||g_i||), ||·|| the flat L2
norm over ALL trainable parameters jointly, rows whose norm is not finite contribute exactly 0,
chunks of `max_physical_batch_size` rows bound memory and never change the result, an empty batch
gives zeros. It agrees with the vmap engine up to floating-point rounding (tests pin ~1e-5
relative in float32, 1e-10 in float64). The result is private: release it through noise only.

How (Goodfellow 2015; Li et al. 2022 "ghost clipping"; Bu et al. 2023 "book-keeping", BK):

Pass 1 — one forward with hooks on every supported layer that has trainable parameters. Each
hook keeps the layer's input a (detached) and its output. One backward of the summed loss, asked
only for the gradients δ of the loss w.r.t. those outputs (`torch.autograd.grad(loss, outputs)`):
autograd then skips every weight-gradient kernel, so this costs less than a normal backward.
Because the loss is a sum of per-row terms and every supported layer treats rows independently,
row i of δ is row i's own output gradient, so g_i of a layer is a function of (a_i, δ_i) only:

- Linear, 2-D input: g_i = δ_i a_iᵀ, ||g_i||² = ||a_i||²·||δ_i||² (+ bias ||δ_i||²): O(d) per row.
- Linear on (B, T, d) and Conv1d/Conv2d (unfolded to patches, per group): g_i = Σ_t δ_it a_itᵀ.
  Either the Gram ("ghost") form ||g_i||² = Σ_{t,t'} (a_it·a_it')(δ_it·δ_it') — O(T²(d+p)) per
  row, no per-sample gradient — or the materialised per-sample gradient — O(T·d·p) per row and
  B·d·p memory, but its weighted sum is then a cheap tensordot. `_use_gram` picks per call from
  the shapes (flop count, with a memory cap on materialisation). Conv gradients are materialised
  by im2col + batched GEMM, or on CPU by one einsum over a strided window view (no im2col copy)
  when the layer has fewer patch features than positions (see CONV_STRIDED_DEVICES).
- GroupNorm / LayerNorm: per-sample gradients are (B, C)-sized: computed exactly from the
  recomputed normalised input x̂ (Σ over positions of δ·x̂, and of δ).
- Embedding: g_i = Σ_t onehot(idx_it) δ_itᵀ; ||g_i||² = Σ_{t,t'} [idx_it = idx_it'] δ_it·δ_it'
  (or the (B, V, d) materialisation when that is smaller).
A layer called several times in one forward (weights reused) is exact too: its calls are stacked
along the position axis (Linear/Conv/Embedding) or their per-sample gradients summed (norms).

The per-layer squared norms are summed to the joint flat norm; scales come from the map, rows
with a non-finite norm get scale 0 and are masked to zero in every operand (0·inf would be NaN).

Pass 2 — the clipped sum Σ_i scale_i·g_i = ∇_θ Σ_i scale_i·ℓ_i, with the scales constants. Three
exact ways, chosen by `pass2` (measured in bench/engine_compare.py; "bk" is the fastest on every
case measured, so it is the default):

- "bk" (book-keeping): no second backward at all. Each layer's weighted sum is computed from the
  stored (a, δ): (s·δ)ᵀa — one GEMM per layer, the same work as the weight-gradient kernels pass 1
  skipped — or a tensordot of the scales with the already materialised per-sample gradients.
- "retain": pass 1 keeps its graph; a second backward of the model output with output gradient
  scale_i·∂ℓ_i/∂out_i (a VJP, which equals ∇ Σ scale_i ℓ_i because the loss is a sum of per-row
  terms).
- "recompute": pass 1 frees its graph; forward again on the rows with a finite norm and backward
  with the same scaled output gradient.
"retain" and "recompute" never see rows with a non-finite norm: "recompute" drops them and
"retain" falls back to "recompute" for any chunk that has one (a scale of 0 does not stop NaN
from an inf activation propagating through the second backward).

What is supported (`supports(model)`, `check_ghost_supported(model)` names the offending layer):
exact types only (a subclass may override forward). Containers: Sequential, ModuleList (forward
calls children only), plus classes registered with `ghost_container`. Parameter-free leaves:
activations, pooling, Identity, Flatten/Unflatten that keep dimension 0 as the batch. Layers with
parameters: Linear, Conv1d, Conv2d, GroupNorm, LayerNorm, Embedding (without max_norm, which
rewrites the weight from the data, or scale_grad_by_freq, whose gradient depends on the batch).
Every trainable parameter must be the weight/bias of exactly one such layer (no tied parameters
across layers, no parameters used directly by a container's forward). Anything else raises
ValueError and the caller should use the vmap engine (`clipped_grad_sum`), which is exact for
any module it accepts. At run time the hooks also check that each hooked layer keeps the batch on
dimension 0 and that no recorded tensor is modified in place afterwards (e.g. ReLU(inplace=True)
after a Linear); either failure raises ValueError. Error texts name layers and types only, never
a shape that would reveal the realised batch size.

Numerics: the factorised 2-D Linear form, the norm layers and the materialised forms have the
same O(eps) relative rounding as the vmap engine. The Gram form sums T² terms of both signs, so
for a row whose gradient is much smaller than Σ_t ||a_t||·||δ_t|| (cancellation across positions)
its squared norm carries an absolute error up to about eps·(Σ_t ||a_t||·||δ_t||)² — in the worst
case a relative error growing like eps·T, not eps. An underestimated norm lets a clipped row
exceed the bound by that relative amount (the float slack discussed in
worker/optimizers/per_sample_maps.py, larger here). The Gram form is only chosen where
materialising would exceed MATERIALISE_MAX_ELEMENTS or cost more flops; with the default
pass2="bk" no zoo model uses it at the benchmarked shapes (cnn2-gn's second conv does under
"retain"/"recompute" and in ghost_per_sample_norms, where the weighted sum is not needed). The
clamp at 0 keeps a rounded Gram sum a valid square.

Device-agnostic: each chunk is moved to the parameters' device; the only host synchronisation is
one `bool(all rows finite)` per chunk, as in clipped_grad_sum (checking is cheaper than masking
every operand); the Gram/materialise choice depends on shapes only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from worker.optimizers.losses import LossSpec, get_loss, prepare_targets
from worker.optimizers.per_sample import PARAMETER_FREE_MODULES, PerSampleMap, trainable_parameters
from worker.optimizers.secure_random import SecureRandom

__all__ = [
    "GHOST_CONTAINERS",
    "GHOST_LAYERS",
    "GHOST_PARAMETER_FREE",
    "GhostClipAggregator",
    "Pass2",
    "check_ghost_supported",
    "ghost_clipped_grad_sum",
    "ghost_container",
    "ghost_per_sample_norms",
    "ghost_weighted_grad_sums",
    "supports",
]

Pass2 = Literal["bk", "retain", "recompute"]
PASS2_MODES: tuple[str, ...] = ("bk", "retain", "recompute")

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])

# Containers whose forward only calls child modules (never reads a child's parameters directly).
GHOST_CONTAINERS: set[type[nn.Module]] = {nn.Sequential, nn.ModuleList}

# Parameter-free modules that treat rows independently and keep dimension 0 as the batch
# (Flatten/Unflatten are further checked for the dimensions they touch).
GHOST_PARAMETER_FREE: set[type[nn.Module]] = set(PARAMETER_FREE_MODULES)

# Layers with parameters, each with an exact per-sample norm rule below.
GHOST_LAYERS: tuple[type[nn.Module], ...] = (
    nn.Linear,
    nn.Conv1d,
    nn.Conv2d,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.Embedding,
)

# Materialising per-sample weight gradients of one layer costs chunk × |W| elements; above this
# many elements the Gram form is used when it needs less memory (float32: 4 bytes each).
MATERIALISE_MAX_ELEMENTS = 1 << 26


def ghost_container(cls: ModuleT) -> ModuleT:
    """Class decorator: allow a zoo-internal container (e.g. a residual block) in the ghost engine.

    Register a class only if its forward treats rows independently, keeps dimension 0 as the
    batch, and touches its children's parameters ONLY by calling the children (no
    `F.linear(x, self.fc.weight)`); it must own no parameters itself. Children are checked
    separately. (It must also be registered with per_sample.supported_module for the vmap engine.)
    """
    GHOST_CONTAINERS.add(cls)
    return cls


# ----------------------------------------------------------------------------- support check


def check_ghost_supported(model: nn.Module) -> None:
    """Raise ValueError naming the first module the ghost engine cannot handle exactly."""
    owners: dict[int, tuple[nn.Module, str]] = {}  # a reused layer is fine, tied params not
    for name, module in model.named_modules(remove_duplicate=False):
        where = name or "<root>"
        kind = type(module)
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"module {where} is {kind.__name__}: BatchNorm mixes samples and is not "
                "supported with DP; use GroupNorm"
            )
        if kind in GHOST_LAYERS:
            if kind is nn.Embedding and (module.max_norm is not None or module.scale_grad_by_freq):
                raise ValueError(
                    f"module {where} (Embedding) uses max_norm or scale_grad_by_freq, which the "
                    "ghost clipping engine does not support"
                )
            allowed = {"weight", "bias"}
        elif kind in GHOST_CONTAINERS or kind in GHOST_PARAMETER_FREE:
            allowed = set()
        else:
            raise ValueError(
                f"module {where} of type {kind.__name__} is not supported by the ghost clipping "
                "engine"
            )
        if kind is nn.Flatten and module.start_dim < 1:
            raise ValueError(
                f"module {where} (Flatten) has start_dim={module.start_dim}: the ghost clipping "
                "engine needs dimension 0 to stay the batch (use start_dim >= 1)"
            )
        if kind is nn.Unflatten and (not isinstance(module.dim, int) or module.dim < 1):
            raise ValueError(
                f"module {where} (Unflatten) has dim={module.dim!r}: the ghost clipping engine "
                "needs dimension 0 to stay the batch (use dim >= 1)"
            )
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname not in allowed:
                raise ValueError(
                    f"parameter {pname!r} of module {where} ({kind.__name__}) is not the "
                    "weight/bias of a layer the ghost clipping engine supports"
                )
            previous = owners.get(id(p))
            if previous is not None and previous[0] is not module:
                raise ValueError(
                    f"parameter {where}.{pname} is shared with {previous[1]}: tied parameters "
                    "across layers are not supported by the ghost clipping engine"
                )
            owners[id(p)] = (module, f"{where}.{pname}")


def supports(model: nn.Module) -> bool:
    """Whether the ghost engine handles `model` (False: use the vmap engine instead)."""
    try:
        check_ghost_supported(model)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------- pass 1: recording


@dataclass
class _Call:
    inp: torch.Tensor  # detached input
    out: torch.Tensor  # output, still in the graph
    inp_version: int
    out_version: int


@dataclass
class _Recorder:
    """Forward hooks on the trainable layers; records (input, output) per call while active."""

    model: nn.Module
    layers: list[tuple[str, nn.Module]] = field(default_factory=list)
    calls: dict[int, list[_Call]] = field(default_factory=dict)
    batch: int = -1
    active: bool = False
    _handles: list[torch.utils.hooks.RemovableHandle] = field(default_factory=list)

    def __enter__(self) -> _Recorder:
        for name, module in self.model.named_modules():
            if type(module) in GHOST_LAYERS and any(
                p.requires_grad for p in module.parameters(recurse=False)
            ):
                where = name or "<root>"
                self.layers.append((where, module))
                hook = self._make_hook(where)
                self._handles.append(module.register_forward_hook(hook, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.calls.clear()

    def start(self, batch: int) -> None:
        self.calls = {id(m): [] for _, m in self.layers}
        self.batch = batch
        self.active = True

    def stop(self) -> None:
        self.active = False

    def _make_hook(self, where: str) -> Callable[..., None]:
        def hook(
            module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object
        ) -> None:
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
            _check_call_shape(where, module, inp, output, self.batch)
            self.calls[id(module)].append(
                _Call(inp.detach(), output, inp._version, output._version)
            )

        return hook

    def check_versions(self) -> None:
        for where, module in self.layers:
            for call in self.calls[id(module)]:
                if call.inp._version != call.inp_version or call.out._version != call.out_version:
                    raise ValueError(
                        f"the input or output of module {where} ({type(module).__name__}) is "
                        "modified in place later in the forward (e.g. an inplace activation); "
                        "the ghost clipping engine does not support this"
                    )


def _check_call_shape(
    where: str, module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int
) -> None:
    kind = type(module).__name__
    ok = inp.dim() >= 2 and inp.shape[0] == batch and out.shape[0] == batch
    if isinstance(module, nn.Conv1d):
        ok = ok and inp.dim() == 3
    elif isinstance(module, nn.Conv2d):
        ok = ok and inp.dim() == 4
    elif isinstance(module, nn.LayerNorm):
        ok = ok and inp.dim() > len(module.normalized_shape)
    elif isinstance(module, nn.Embedding):
        ok = inp.dim() >= 1 and inp.shape[0] == batch and out.shape[0] == batch
    if not ok:
        raise ValueError(
            f"module {where} ({kind}) got an input that does not keep the rows of the batch on "
            "dimension 0; the ghost clipping engine cannot make it per-sample"
        )


# ----------------------------------------------------------------------------- per-layer rules


class _Totals:
    """Running sums per parameter name. The first contribution is kept as it is (it is always a
    freshly computed tensor), which saves a zero-fill and an add per parameter and chunk."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        current = self.sums.get(name)
        if current is None:
            self.sums[name] = value
        else:
            current.add_(value)

    def index_add(self, name: str, like: torch.Tensor, index: torch.Tensor,
                  source: torch.Tensor) -> None:
        current = self.sums.get(name)
        if current is None:
            current = self.sums[name] = torch.zeros_like(
                like, memory_format=torch.contiguous_format)
        current.index_add_(0, index, source)

    def result(self, params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
        """name -> sum with the parameter's shape, in parameter order (zeros if never added)."""
        out = {}
        for name, p in params.items():
            value = self.sums.get(name)
            out[name] = (torch.zeros_like(p, memory_format=torch.contiguous_format)
                         if value is None else value.reshape(p.shape).contiguous())
        return out


# accumulate(weights (B,), row_mask, totals): totals[name] += Σ_i weights_i·g_i. row_mask is None
# when every row is finite, else a (B,) bool tensor: rows outside it must contribute exactly 0.
Accumulate = Callable[[torch.Tensor, "torch.Tensor | None", _Totals], None]


@dataclass
class _LayerWork:
    sq_norms: torch.Tensor  # (B,)
    accumulate: Accumulate


def _rows(mask: torch.Tensor | None, t: torch.Tensor) -> torch.Tensor:
    """t with the rows outside `mask` set to exactly 0 (t has shape (B, ...))."""
    if mask is None:
        return t
    return torch.where(mask.view(-1, *([1] * (t.dim() - 1))), t, 0.0)


def _sq(t: torch.Tensor, dims: int) -> torch.Tensor:
    """Squared L2 norm over the last `dims` dimensions."""
    return torch.linalg.vector_norm(t.flatten(-dims) if dims > 1 else t, dim=-1).square()


def _use_gram(batch: int, groups: int, positions: int, k: int, o: int, *, bk: bool) -> bool:
    """Gram form (True) or materialised per-sample gradients (False) for a (positions × k) →
    (positions × o) map per group: compare per-row flops, cap the materialised memory."""
    t, g = positions, groups
    mat_flops = t * o * k + (o * k if bk else 0)
    gram_flops = t * t * (k + o) + (t * o * k if bk else 0)
    mat_mem, gram_mem = batch * g * o * k, batch * g * t * t
    if mat_flops <= gram_flops:
        return mat_mem > MATERIALISE_MAX_ELEMENTS and gram_mem < mat_mem
    return not (gram_mem > MATERIALISE_MAX_ELEMENTS and mat_mem < gram_mem)


def _weighted_outer_sum(sd: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Σ_{i,t} sd_it a_itᵀ per group: (B, g, T, o), (B, g, T, k) -> (g, o, k). One GEMM."""
    batch, groups, positions, o = sd.shape
    k = a.shape[-1]
    if groups == 1:
        return (sd.reshape(batch * positions, o).T @ a.reshape(batch * positions, k)).unsqueeze(0)
    return torch.einsum("bgto,bgtk->gok", sd, a)


def _positional_work(
    weight_name: str | None,
    bias_name: str | None,
    weight_shape: torch.Size,
    D: torch.Tensor,
    *,
    A: torch.Tensor | None = None,
    G: torch.Tensor | None = None,
) -> _LayerWork:
    """Linear/Conv rule. D: (B, g, T, o) output gradients per group and position. For the weight
    (if trainable) exactly one of A: (B, g, T, k) inputs per position (Gram form; T = 1 is the
    ||a||²·||δ||² case) or G: (B, g, o, k) materialised per-sample gradients.

    Per-sample weight gradient of group j: G_ij = Σ_t D_ijt A_ijtᵀ (o × k); bias: Σ_t D_ijt.
    """
    batch, groups, positions, o = D.shape
    terms: list[torch.Tensor] = []
    parts: list[Accumulate] = []

    if bias_name is not None:
        gb = D.sum(dim=2).reshape(batch, -1)  # (B, g·o) = (B, C_out)
        terms.append(_sq(gb, 1))

        def add_bias(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
            totals.add(bias_name, w @ _rows(mask, gb))

        parts.append(add_bias)

    if weight_name is not None and G is not None:
        terms.append(_sq(G, 3))

        def add_weight(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
            s = torch.tensordot(w, _rows(mask, G), dims=1)  # (g, o, k)
            totals.add(weight_name, s.reshape(weight_shape))

        parts.append(add_weight)
    elif weight_name is not None:
        assert A is not None
        if positions == 1:
            # ||δ aᵀ||² = ||a||²·||δ||²: no per-sample gradient, O(k + o) per row.
            terms.append((_sq(A, 3) * _sq(D, 3)) if groups == 1
                         else (_sq(A, 1) * _sq(D, 1)).sum(dim=(1, 2)))
        else:  # Gram form: Σ_{t,t'} (a_t·a_t')(δ_t·δ_t')
            aat = torch.matmul(A, A.transpose(-1, -2))  # (B, g, T, T)
            ddt = torch.matmul(D, D.transpose(-1, -2))
            terms.append(torch.linalg.vecdot(aat.flatten(1), ddt.flatten(1)).clamp_min(0.0))
            del aat, ddt

        def add_weight(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
            sd = _rows(mask, D * w.view(-1, 1, 1, 1))
            s = _weighted_outer_sum(sd, _rows(mask, A))
            totals.add(weight_name, s.reshape(weight_shape))

        parts.append(add_weight)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
        for part in parts:
            part(w, mask, totals)

    sq = terms[0] if len(terms) == 1 else terms[0] + terms[1]
    return _LayerWork(sq, accumulate)


def _dense_work(
    weight_name: str | None, bias_name: str | None, a: torch.Tensor, d: torch.Tensor
) -> _LayerWork:
    """Linear on (B, k) rows, called once: ||g_i||² = ||δ_i||²·(||a_i||² + 1) with a bias,
    and the clipped sum is (s·δ)ᵀa, Σ s·δ — the fast path of `_positional_work` (fewer ops)."""
    sq = torch.linalg.vecdot(d, d)
    if weight_name is not None:
        sq_a = torch.linalg.vecdot(a, a)
        sq = sq * (sq_a + 1.0) if bias_name is not None else sq * sq_a

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
        sd = _rows(mask, d * w.unsqueeze(1))
        if weight_name is not None:
            totals.add(weight_name, sd.T @ _rows(mask, a))
        if bias_name is not None:
            totals.add(bias_name, sd.sum(dim=0))

    return _LayerWork(sq, accumulate)


def _conv_input(
    module: nn.Conv1d | nn.Conv2d, a: torch.Tensor
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The input as the convolution sees it, and the padding still to apply (zeros)."""
    if module.padding_mode != "zeros" or isinstance(module.padding, str):
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        a = F.pad(a, module._reversed_padding_repeated_twice, mode=mode)
        return a, (0,) * len(module.kernel_size)
    return a, tuple(module.padding)  # type: ignore[arg-type]


def _conv_patches(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """Unfolded input patches (B, C_in·∏kernel, positions), matching the weight's layout."""
    a, padding = _conv_input(module, a)
    if isinstance(module, nn.Conv1d):
        return F.unfold(
            a.unsqueeze(2),
            kernel_size=(1, module.kernel_size[0]),
            dilation=(1, module.dilation[0]),
            padding=(0, padding[0]),
            stride=(1, module.stride[0]),
        )
    return F.unfold(
        a, kernel_size=module.kernel_size, dilation=module.dilation, padding=padding,
        stride=module.stride,
    )


# Per-sample conv weight gradients are materialised either by im2col (F.unfold) + batched GEMM,
# or — on these device types, for layers with fewer patch features than positions (e.g. a first
# conv on 1 channel) — by one einsum over a strided window view of the input, which skips the
# im2col copy (≈1.5x faster for cnn2-gn's first conv on CPU; slower for its second). Both exact.
# (Folding the batch into the groups of one weight-gradient convolution was also tried: on CPU its
# oneDNN timings varied 1x-5x from run to run, so it is not used.)
CONV_STRIDED_DEVICES: set[str] = {"cpu"}


def _conv_per_sample_grads(
    module: nn.Conv1d | nn.Conv2d, a: torch.Tensor, d: torch.Tensor
) -> torch.Tensor:
    """Per-sample weight gradients (B, g, o, k) of one call."""
    batch, g = a.shape[0], module.groups
    o = module.out_channels // g
    k = module.weight[0].numel()
    spatial = d.shape[2:]
    if a.device.type in CONV_STRIDED_DEVICES and k <= math.prod(spatial):
        x, padding = _conv_input(module, a)
        if any(padding):
            x = F.pad(x, [q for q in reversed(padding) for _ in range(2)])
        x = x.contiguous()
        nd = len(spatial)
        c = x.shape[1] // g
        sb, sc, *ss = x.stride()
        window = x.as_strided(  # (B, g, c, *kernel, *out_spatial): the patches, without a copy
            (batch, g, c, *module.kernel_size, *spatial),
            (sb, sc * c, sc, *(st * dl for st, dl in zip(ss, module.dilation, strict=True)),
             *(st * sd for st, sd in zip(ss, module.stride, strict=True))),
        )
        pos, kern = "hw"[:nd], "ij"[:nd]
        G = torch.einsum(f"bgo{pos},bgc{kern}{pos}->bgoc{kern}", d.reshape(batch, g, o, *spatial),
                         window)
        return G.reshape(batch, g, o, k)
    patches = _conv_patches(module, a)  # (B, g·k, T)
    return torch.matmul(
        d.reshape(batch, g, o, -1), patches.view(batch, g, -1, patches.shape[-1]).transpose(-1, -2)
    )


def _linear_conv_work(
    module: nn.Module,
    names: dict[str, str | None],
    calls: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    bk: bool,
) -> _LayerWork:
    is_linear = isinstance(module, nn.Linear)
    batch = calls[0][0].shape[0]
    if is_linear and len(calls) == 1 and calls[0][0].dim() == 2:
        return _dense_work(names["weight"], names["bias"], calls[0][0], calls[0][1])
    if is_linear:
        g, o, k = 1, module.out_features, module.in_features
        Ds = [d.reshape(batch, 1, -1, o) for _, d in calls]
    else:
        assert isinstance(module, (nn.Conv1d, nn.Conv2d))
        g = module.groups
        o = module.out_channels // g
        k = module.weight[0].numel()
        Ds = [d.reshape(batch, g, o, -1).transpose(-1, -2) for _, d in calls]  # (B, g, T, o)
    D = Ds[0] if len(Ds) == 1 else torch.cat(Ds, dim=2)
    positions = D.shape[2]
    weight, bias, shape = names["weight"], names["bias"], module.weight.shape
    if weight is None:  # bias only: the inputs are never needed
        return _positional_work(None, bias, shape, D)
    if positions > 1 and not _use_gram(batch, g, positions, k, o, bk=bk):
        if is_linear:
            A = torch.cat([a.reshape(batch, 1, -1, k) for a, _ in calls], dim=2)
            G = torch.matmul(D.transpose(-1, -2), A)
        else:
            G = _conv_per_sample_grads(module, calls[0][0], calls[0][1])  # type: ignore[arg-type]
            for a, d in calls[1:]:
                G = G + _conv_per_sample_grads(module, a, d)  # type: ignore[arg-type]
        return _positional_work(weight, bias, shape, D, G=G)
    if is_linear:
        As = [a.reshape(batch, 1, -1, k) for a, _ in calls]
    else:
        As = []
        for a, _ in calls:
            patches = _conv_patches(module, a)  # type: ignore[arg-type]
            As.append(patches.view(batch, g, k, -1).transpose(-1, -2))  # (B, g, T, k)
    A = As[0] if len(As) == 1 else torch.cat(As, dim=2)
    return _positional_work(weight, bias, shape, D, A=A)


def _norm_work(
    module: nn.GroupNorm | nn.LayerNorm, names: dict[str, str | None],
    calls: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> _LayerWork:
    """GroupNorm/LayerNorm: exact per-sample gradients, (B, C)-sized."""
    gw: torch.Tensor | None = None
    gb: torch.Tensor | None = None
    for a, d in calls:
        batch = a.shape[0]
        if isinstance(module, nn.GroupNorm):
            # (B, C, *) -> sum over positions -> (B, C)
            def reduce(t: torch.Tensor) -> torch.Tensor:
                return t.reshape(batch, module.num_channels, -1).sum(dim=2)

            xhat = (
                F.group_norm(a, module.num_groups, eps=module.eps)
                if names["weight"] is not None else None
            )
        else:
            shape = tuple(module.normalized_shape)

            def reduce(t: torch.Tensor) -> torch.Tensor:  # (B, *, *shape) -> (B, *shape)
                return t.reshape(batch, -1, *shape).sum(dim=1)

            xhat = (
                F.layer_norm(a, shape, eps=module.eps) if names["weight"] is not None else None
            )
        if xhat is not None:
            w_part = reduce(d * xhat)
            gw = w_part if gw is None else gw + w_part
        if names["bias"] is not None:
            b_part = reduce(d)
            gb = b_part if gb is None else gb + b_part
    grads = {n: g for n, g in ((names["weight"], gw), (names["bias"], gb)) if n is not None}
    return _materialised_work(grads)


def _embedding_work(
    module: nn.Embedding, names: dict[str, str | None],
    calls: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> _LayerWork:
    name = names["weight"]
    assert name is not None
    batch = calls[0][0].shape[0]
    dim = module.embedding_dim
    idx = torch.cat([a.reshape(batch, -1) for a, _ in calls], dim=1)  # (B, T)
    D = torch.cat([d.reshape(batch, -1, dim) for _, d in calls], dim=1)  # (B, T, d)
    if module.padding_idx is not None:  # the padding row gets no gradient
        D = D * (idx != module.padding_idx).unsqueeze(-1).to(D.dtype)
    positions, vocab = idx.shape[1], module.num_embeddings
    # Gram: T²·(d+1) flops and T² memory per row; materialised: V·d of both (zero-fill, norm).
    gram = (
        positions * positions * (dim + 1) <= vocab * dim
        or batch * vocab * dim > MATERIALISE_MAX_ELEMENTS
    )
    if not gram:
        G = D.new_zeros(batch, vocab, dim)
        G.scatter_add_(1, idx.unsqueeze(-1).expand(-1, -1, dim), D)
        return _materialised_work({name: G})
    same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(D.dtype)  # (B, T, T)
    sq = (same * torch.matmul(D, D.transpose(1, 2))).sum(dim=(1, 2)).clamp_min(0.0)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
        sd = _rows(mask, D * w.view(-1, 1, 1))
        totals.index_add(name, module.weight, idx.reshape(-1), sd.reshape(-1, dim))

    return _LayerWork(sq, accumulate)


def _materialised_work(grads: dict[str, torch.Tensor]) -> _LayerWork:
    """Per-sample gradients already in hand (B, *param.shape): norm and tensordot."""
    sq = torch.stack([_sq(g.reshape(g.shape[0], -1), 1) for g in grads.values()]).sum(dim=0)

    def accumulate(w: torch.Tensor, mask: torch.Tensor | None, totals: _Totals) -> None:
        for name, g in grads.items():
            totals.add(name, torch.tensordot(w, _rows(mask, g), dims=1))

    return _LayerWork(sq, accumulate)


def _layer_work(
    module: nn.Module, names: dict[str, str | None],
    calls: Sequence[tuple[torch.Tensor, torch.Tensor]], *, bk: bool,
) -> _LayerWork:
    if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d)):
        return _linear_conv_work(module, names, calls, bk=bk)
    if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
        return _norm_work(module, names, calls)
    if isinstance(module, nn.Embedding):
        return _embedding_work(module, names, calls)
    raise AssertionError(type(module))  # unreachable: the recorder hooks GHOST_LAYERS only


# ----------------------------------------------------------------------------- the engine


@dataclass
class _Chunk:
    sq_norms: torch.Tensor
    works: list[_LayerWork]
    out_grad: torch.Tensor | None
    out: torch.Tensor | None


def _pass1(
    model: nn.Module,
    recorder: _Recorder,
    x: torch.Tensor,
    target: torch.Tensor,
    spec: LossSpec,
    layer_names: list[dict[str, str | None]],
    *,
    bk: bool,
    want_out_grad: bool,
    retain_graph: bool,
) -> _Chunk:
    batch = x.shape[0]
    recorder.start(batch)
    with torch.enable_grad():  # also when the caller runs under torch.no_grad()
        try:
            out = model(x)
        finally:
            recorder.stop()
        recorder.check_versions()
        return _pass1_backward(recorder, out, target, spec, layer_names, bk=bk,
                               want_out_grad=want_out_grad, retain_graph=retain_graph)


def _pass1_backward(
    recorder: _Recorder,
    out: torch.Tensor,
    target: torch.Tensor,
    spec: LossSpec,
    layer_names: list[dict[str, str | None]],
    *,
    bk: bool,
    want_out_grad: bool,
    retain_graph: bool,
) -> _Chunk:
    taps: list[torch.Tensor] = []
    layout: list[tuple[int, torch.Tensor]] = []  # (layer index, detached input) per tap
    for layer_index, (_, module) in enumerate(recorder.layers):
        for call in recorder.calls[id(module)]:
            taps.append(call.out)
            layout.append((layer_index, call.inp))
    if not out.requires_grad:
        raise ValueError("the model output does not depend on any trainable parameter")
    loss = spec.fn(out, target)
    grads = torch.autograd.grad(
        loss, taps + ([out] if want_out_grad else []), allow_unused=True, materialize_grads=True,
        retain_graph=retain_graph,
    )
    per_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for (layer_index, inp), g in zip(layout, grads, strict=False):
        per_layer.setdefault(layer_index, []).append((inp, g))
    recorder.calls = {}  # drop the graph references held by the recorder
    works = [
        _layer_work(recorder.layers[index][1], layer_names[index], calls, bk=bk)
        for index, calls in per_layer.items()
    ]
    sq = works[0].sq_norms
    for work in works[1:]:
        sq = sq + work.sq_norms
    out_grad = grads[-1] if want_out_grad else None
    return _Chunk(sq, works, out_grad, out if retain_graph else None)


def _iter_chunks(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, loss: str, max_physical_batch_size: int
):
    if isinstance(max_physical_batch_size, bool) or max_physical_batch_size < 1:
        raise ValueError(f"max_physical_batch_size must be >= 1, got {max_physical_batch_size}")
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    check_ghost_supported(model)
    params = trainable_parameters(model)
    if not params:
        raise ValueError("model has no trainable parameters")
    first = next(iter(params.values()))
    device, dtype = first.device, first.dtype
    spec = get_loss(loss)
    for start in range(0, X.shape[0], max_physical_batch_size):
        x = X[start : start + max_physical_batch_size].to(device)
        if x.is_floating_point():
            x = x.to(dtype)
        target = prepare_targets(
            spec, y[start : start + max_physical_batch_size].to(device), dtype=dtype
        )
        yield spec, x, target


def _layer_param_names(model: nn.Module, recorder: _Recorder) -> list[dict[str, str | None]]:
    by_id = {id(p): name for name, p in trainable_parameters(model).items()}
    names = []
    for _, module in recorder.layers:
        entry: dict[str, str | None] = {}
        for pname in ("weight", "bias"):
            p = getattr(module, pname, None)
            entry[pname] = by_id.get(id(p)) if isinstance(p, nn.Parameter) else None
        names.append(entry)
    return names


def ghost_per_sample_norms(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    max_physical_batch_size: int,
) -> torch.Tensor:
    """||g_i|| (flat L2 over all trainable parameters) for every row, shape (n,), on the
    parameters' device. Private: for tests and for algorithms that keep it inside the worker."""
    norms = []
    with _Recorder(model) as recorder:
        names = _layer_param_names(model, recorder)
        for spec, x, target in _iter_chunks(
            model, X, y, loss=loss, max_physical_batch_size=max_physical_batch_size
        ):
            chunk = _pass1(model, recorder, x, target, spec, names, bk=False,
                           want_out_grad=False, retain_graph=False)
            norms.append(chunk.sq_norms.sqrt())
    if not norms:
        first = next(iter(trainable_parameters(model).values()))
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
) -> dict[str, torch.Tensor]:
    """Σ_i scale_i · g_i over the rows of (X, y): the same result as `clipped_grad_sum`.

    Returns name -> tensor of the parameter's shape on the parameter's device (zeros for an empty
    batch). Raises ValueError, before any computation, for a model `supports` rejects. The model
    is not modified (hooks are removed, `.grad` is never touched).
    """
    if pass2 not in PASS2_MODES:
        raise ValueError(f"pass2 must be one of {PASS2_MODES}, got {pass2!r}")
    params = trainable_parameters(model)
    totals = _Totals()
    with _Recorder(model) as recorder:
        names = _layer_param_names(model, recorder)
        for spec, x, target in _iter_chunks(
            model, X, y, loss=loss, max_physical_batch_size=max_physical_batch_size
        ):
            chunk = _pass1(
                model, recorder, x, target, spec, names, bk=pass2 == "bk",
                want_out_grad=pass2 != "bk", retain_graph=pass2 == "retain",
            )
            with torch.no_grad():
                norms = chunk.sq_norms.sqrt()
                finite = torch.isfinite(norms)
                # One host sync per chunk (as clipped_grad_sum): masking costs more than checking.
                all_finite = bool(finite.all())
                scale = per_sample_map.scale_factors(norms)
                if not all_finite:
                    scale = torch.where(finite, scale, 0.0)
                scale = scale.to(chunk.sq_norms.dtype)
            if pass2 == "bk":
                with torch.no_grad():
                    for work in chunk.works:
                        work.accumulate(scale, None if all_finite else finite, totals)
                continue
            del chunk.works
            assert chunk.out_grad is not None
            out_grad = chunk.out_grad * scale.view(-1, *([1] * (chunk.out_grad.dim() - 1)))
            if pass2 == "retain" and all_finite:
                assert chunk.out is not None
                grads = torch.autograd.grad(
                    chunk.out, list(params.values()), grad_outputs=out_grad,
                    allow_unused=True, materialize_grads=True,
                )
            else:
                chunk.out = None  # free pass 1's graph before the second forward
                keep = finite.nonzero().squeeze(1)
                if keep.numel() == 0:
                    continue
                recorder.stop()
                with torch.enable_grad():
                    out = model(x.index_select(0, keep))
                grads = torch.autograd.grad(
                    out, list(params.values()), grad_outputs=out_grad.index_select(0, keep),
                    allow_unused=True, materialize_grads=True,
                )
            with torch.no_grad():
                for name, g in zip(params, grads, strict=True):
                    totals.add(name, g)
    return totals.result(params)


@dataclass(frozen=True)
class GhostClipAggregator:
    """Σ_i scale_i·g_i for a per-sample map, by ghost clipping / book-keeping.

    Same sum and the same sensitivity (the map's norm bound) as `PerSampleMapAggregator`, so the
    privacy analysis of the calling loop is unchanged; only the arithmetic differs. Raises
    ValueError for a model `supports` rejects (use PerSampleMapAggregator there).
    """

    per_sample_map: PerSampleMap
    pass2: Pass2 = "bk"

    @property
    def sensitivity(self) -> float:
        return self.per_sample_map.norm_bound

    def clipped_sum(
        self,
        model: nn.Module,
        X: torch.Tensor,
        y: torch.Tensor,
        *,
        step: int,
        loss: str,
        max_physical_batch_size: int,
        generator: SecureRandom,
    ) -> dict[str, torch.Tensor]:
        return ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=self.per_sample_map,
            max_physical_batch_size=max_physical_batch_size, pass2=self.pass2,
        )


def ghost_weighted_grad_sums(
    model: nn.Module,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: str,
    per_sample_maps: Sequence[PerSampleMap],
    max_physical_batch_size: int,
) -> list[dict[str, torch.Tensor]]:
    """Σ_i scale_k(||g_i||)·g_i for several maps k from ONE book-keeping pass.

    Result k equals ``ghost_clipped_grad_sum(..., per_sample_map=per_sample_maps[k], pass2="bk")``
    (same masking of rows with a non-finite norm): pass 1 and the norms are shared, only the
    per-layer weighted GEMMs are repeated. For algorithms that need several weightings of the
    same per-sample gradients (DiceSGD: the clipped sum and the clipping residual). Private
    results: release them through noise only.
    """
    params = trainable_parameters(model)
    totals = [_Totals() for _ in per_sample_maps]
    with _Recorder(model) as recorder:
        names = _layer_param_names(model, recorder)
        for spec, x, target in _iter_chunks(
            model, X, y, loss=loss, max_physical_batch_size=max_physical_batch_size
        ):
            chunk = _pass1(model, recorder, x, target, spec, names, bk=True,
                           want_out_grad=False, retain_graph=False)
            with torch.no_grad():
                norms = chunk.sq_norms.sqrt()
                finite = torch.isfinite(norms)
                all_finite = bool(finite.all())
                for per_sample_map, total in zip(per_sample_maps, totals, strict=True):
                    scale = per_sample_map.scale_factors(norms)
                    if not all_finite:
                        scale = torch.where(finite, scale, 0.0)
                    scale = scale.to(chunk.sq_norms.dtype)
                    for work in chunk.works:
                        work.accumulate(scale, None if all_finite else finite, total)
    return [total.result(params) for total in totals]
