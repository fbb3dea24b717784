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
  the shapes (flop count, with a memory cap on materialisation).
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

Numerics: the Gram form sums terms of both signs; when a row's gradient is tiny compared with
Σ_t ||a_t||·||δ_t|| its squared norm carries an absolute rounding error of about
eps·(Σ_t ||a_t||·||δ_t||)², larger than the materialised form's. The clamp at 0 keeps it a valid
norm; for clipping the effect is an O(eps) change in the scale, the same order as the slack
discussed in worker/optimizers/per_sample_maps.py.

Device-agnostic: each chunk is moved to the parameters' device; no host synchronisation on the
"bk" path (the Gram/materialise choice depends on shapes only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from worker.optimizers.losses import LossSpec, get_loss, prepare_targets
from worker.optimizers.per_sample import PerSampleMap, trainable_parameters

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
    "supports",
]

Pass2 = Literal["bk", "retain", "recompute"]
PASS2_MODES: tuple[str, ...] = ("bk", "retain", "recompute")

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])

# Containers whose forward only calls child modules (never reads a child's parameters directly).
GHOST_CONTAINERS: set[type[nn.Module]] = {nn.Sequential, nn.ModuleList}

# Parameter-free modules that treat rows independently and keep dimension 0 as the batch
# (Flatten/Unflatten are further checked for the dimensions they touch).
GHOST_PARAMETER_FREE: set[type[nn.Module]] = {
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    nn.Tanh,
    nn.ReLU,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.ELU,
    nn.LeakyReLU,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
}

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
    owners: dict[int, str] = {}
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
            if previous is not None and previous != f"{where}.{pname}":
                raise ValueError(
                    f"parameter {where}.{pname} is shared with {previous}: tied parameters "
                    "across layers are not supported by the ghost clipping engine"
                )
            owners[id(p)] = f"{where}.{pname}"


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
                self.layers.append((name or "<root>", module))
                self._handles.append(
                    module.register_forward_hook(self._make_hook(name or "<root>"), with_kwargs=True)
                )
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


Sums = dict[str, torch.Tensor]
# accumulate(weights (B,), row_mask (B,) bool, totals): totals[name] += Σ_i weights_i·g_i
Accumulate = Callable[[torch.Tensor, torch.Tensor, Sums], None]


@dataclass
class _LayerWork:
    sq_norms: torch.Tensor  # (B,)
    accumulate: Accumulate


def _rows(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t with the rows outside `mask` set to exactly 0 (shape (B, ...))."""
    return torch.where(mask.view(-1, *([1] * (t.dim() - 1))), t, 0.0)


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


def _positional_work(
    weight_name: str | None,
    bias_name: str | None,
    weight_shape: torch.Size,
    A: torch.Tensor | None,
    D: torch.Tensor,
    *,
    bk: bool,
) -> _LayerWork:
    """Linear/Conv rule. A: (B, g, T, k) inputs per position (None if the weight is frozen),
    D: (B, g, T, o) output gradients.

    Per-sample weight gradient of group j: G_ij = Σ_t D_ijt A_ijtᵀ (o × k); bias: Σ_t D_ijt.
    """
    batch, groups, positions, o = D.shape
    sq = torch.zeros(batch, dtype=D.dtype, device=D.device)
    parts: list[Callable[[torch.Tensor, torch.Tensor, Sums], None]] = []

    if bias_name is not None:
        gb = D.sum(dim=2).reshape(batch, -1)  # (B, g·o) = (B, C_out)
        sq = sq + gb.pow(2).sum(dim=1)

        def add_bias(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
            totals[bias_name].add_(w @ _rows(mask, gb))

        parts.append(add_bias)

    if weight_name is not None:
        assert A is not None
        k = A.shape[-1]
        if positions == 1:
            # ||δ aᵀ||² = ||a||²·||δ||²: no per-sample gradient, O(k + o) per row.
            sq = sq + (A.pow(2).sum(dim=-1) * D.pow(2).sum(dim=-1)).sum(dim=(1, 2))
            gram = True
        elif _use_gram(batch, groups, positions, k, o, bk=bk):
            aat = torch.matmul(A, A.transpose(-1, -2))  # (B, g, T, T)
            ddt = torch.matmul(D, D.transpose(-1, -2))
            sq = sq + (aat * ddt).sum(dim=(1, 2, 3)).clamp_min(0.0)
            del aat, ddt
            gram = True
        else:
            G = torch.matmul(D.transpose(-1, -2), A)  # (B, g, o, k)
            sq = sq + G.pow(2).sum(dim=(1, 2, 3))
            gram = False

        if gram:

            def add_weight(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
                sd = _rows(mask, D * w.view(-1, 1, 1, 1))
                a = _rows(mask, A)
                # Σ_{i,t} sδ_it a_itᵀ per group: one GEMM over (rows × positions).
                s = torch.einsum("bgto,bgtk->gok", sd, a)
                totals[weight_name].add_(s.reshape(weight_shape))

        else:

            def add_weight(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
                s = torch.tensordot(w, _rows(mask, G), dims=1)  # (g, o, k)
                totals[weight_name].add_(s.reshape(weight_shape))

        parts.append(add_weight)

    def accumulate(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
        for part in parts:
            part(w, mask, totals)

    return _LayerWork(sq, accumulate)


def _conv_patches(module: nn.Conv1d | nn.Conv2d, a: torch.Tensor) -> torch.Tensor:
    """Unfolded input patches (B, C_in·∏kernel, positions), matching the weight's layout."""
    explicit_pad = module.padding_mode != "zeros" or isinstance(module.padding, str)
    if isinstance(module, nn.Conv1d):
        explicit_pad = True
    if explicit_pad:
        mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
        a = F.pad(a, module._reversed_padding_repeated_twice, mode=mode)
        padding: tuple[int, ...] = (0,) * len(module.kernel_size)
    else:
        padding = tuple(module.padding)  # type: ignore[arg-type]
    if isinstance(module, nn.Conv1d):
        return F.unfold(
            a.unsqueeze(2),
            kernel_size=(1, module.kernel_size[0]),
            dilation=(1, module.dilation[0]),
            padding=(0, 0),
            stride=(1, module.stride[0]),
        )
    return F.unfold(
        a, kernel_size=module.kernel_size, dilation=module.dilation, padding=padding,
        stride=module.stride,
    )


def _linear_conv_work(
    module: nn.Module, names: dict[str, str | None], calls: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *, bk: bool,
) -> _LayerWork:
    As, Ds = [], []
    for a, d in calls:
        batch = a.shape[0]
        if isinstance(module, nn.Linear):
            As.append(a.reshape(batch, 1, -1, module.in_features))
            Ds.append(d.reshape(batch, 1, -1, module.out_features))
        else:
            assert isinstance(module, (nn.Conv1d, nn.Conv2d))
            g = module.groups
            o = module.out_channels // g
            Ds.append(d.reshape(batch, g, o, -1).transpose(-1, -2))  # (B, g, T, o)
            if names["weight"] is not None:  # bias only: the patches are never needed
                patches = _conv_patches(module, a)
                As.append(patches.view(batch, g, -1, patches.shape[-1]).transpose(-1, -2))
    A = None if not As else As[0] if len(As) == 1 else torch.cat(As, dim=2)
    D = Ds[0] if len(Ds) == 1 else torch.cat(Ds, dim=2)
    return _positional_work(names["weight"], names["bias"], module.weight.shape, A, D, bk=bk)


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

    def accumulate(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
        sd = _rows(mask, D * w.view(-1, 1, 1))
        totals[name].index_add_(0, idx.reshape(-1), sd.reshape(-1, dim))

    return _LayerWork(sq, accumulate)


def _materialised_work(grads: dict[str, torch.Tensor]) -> _LayerWork:
    """Per-sample gradients already in hand (B, *param.shape): norm and tensordot."""
    first = next(iter(grads.values()))
    sq = torch.zeros(first.shape[0], dtype=first.dtype, device=first.device)
    for g in grads.values():
        sq = sq + g.reshape(g.shape[0], -1).pow(2).sum(dim=1)

    def accumulate(w: torch.Tensor, mask: torch.Tensor, totals: Sums) -> None:
        for name, g in grads.items():
            totals[name].add_(torch.tensordot(w, _rows(mask, g), dims=1))

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
    try:
        with torch.enable_grad():
            out = model(x)
    finally:
        recorder.stop()
    recorder.check_versions()
    taps: list[torch.Tensor] = []
    layout: list[tuple[int, torch.Tensor]] = []  # (layer index, detached input) per tap
    for layer_index, (_, module) in enumerate(recorder.layers):
        for call in recorder.calls[id(module)]:
            taps.append(call.out)
            layout.append((layer_index, call.inp))
    if want_out_grad and not out.requires_grad:
        raise ValueError("the model output does not depend on any trainable parameter")
    inputs = taps + ([out] if want_out_grad else [])
    if inputs:
        loss = spec.fn(out, target)
        grads = torch.autograd.grad(
            loss, inputs, allow_unused=True, materialize_grads=True, retain_graph=retain_graph
        )
    else:
        grads = ()
    per_layer: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for (layer_index, inp), g in zip(layout, grads, strict=False):
        per_layer.setdefault(layer_index, []).append((inp, g.detach()))
    recorder.calls = {}  # drop the graph references held by the recorder
    dtype = next(iter(trainable_parameters(model).values())).dtype
    sq = torch.zeros(batch, dtype=dtype, device=x.device)
    works = []
    for layer_index, calls in per_layer.items():
        work = _layer_work(recorder.layers[layer_index][1], layer_names[layer_index], calls, bk=bk)
        sq = sq + work.sq_norms
        works.append(work)
    out_grad = grads[-1].detach() if want_out_grad else None
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
    totals = {
        name: torch.zeros_like(p, memory_format=torch.contiguous_format)
        for name, p in params.items()
    }
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
                scale = torch.where(finite, per_sample_map.scale_factors(norms), 0.0)
                scale = scale.to(chunk.sq_norms.dtype)
            if pass2 == "bk":
                with torch.no_grad():
                    for work in chunk.works:
                        work.accumulate(scale, finite, totals)
                continue
            del chunk.works
            assert chunk.out_grad is not None
            out_grad = chunk.out_grad * scale.view(-1, *([1] * (chunk.out_grad.dim() - 1)))
            if pass2 == "retain" and bool(finite.all()):
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
                for (name, _), g in zip(params.items(), grads, strict=True):
                    totals[name].add_(g)
    return totals


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
        generator: torch.Generator,
    ) -> dict[str, torch.Tensor]:
        return ghost_clipped_grad_sum(
            model, X, y, loss=loss, per_sample_map=self.per_sample_map,
            max_physical_batch_size=max_physical_batch_size, pass2=self.pass2,
        )
