"""Whether the ghost engine is exact for a model: checked on the module tree before any computation.

Exact types only (a subclass may override forward). Containers: Sequential, ModuleList (forward
calls children only), plus classes registered with `ghost_container`. Parameter-free leaves:
activations, pooling, Identity, Flatten/Unflatten that keep dimension 0 as the batch, Dropout with
p = 0 (an identity; a random forward is refused), plus classes registered with
`ghost_parameter_free`. A container or parameter-free class may come with a refusal of the
configurations its forward is not row-wise or deterministic in. Layers with
parameters: those with a rule in `GHOST_LAYERS` (one module per layer family in this package),
minus the configurations a rule refuses. Every trainable parameter must be one the rule of
exactly one such layer covers (no tied parameters across layers, no parameters used directly by a
container's forward). No module may be compiled (`module.compile()`): the compiled forward runs
without the engine's forward hooks and output taps, so it would record nothing (every norm 0, the
sum 0, no error). Rules and containers of optional libraries (Hugging Face Transformers) are
registered the first time a check runs in a process that has imported the library
(`optional.load_optional_families`). Anything else raises ValueError and the caller should use
the vmap engine (`clipped_grad_sum`), which is exact for any module it accepts. Error texts name layers and types
only, never a shape that would reveal the realised batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

from dp.per_example.ghost.optional import load_optional_families
from dp.per_example.ghost.registry import GHOST_LAYERS, Refusal
from dp.per_example.per_sample import PARAMETER_FREE_MODULES

__all__ = [
    "GHOST_CONTAINERS",
    "GHOST_PARAMETER_FREE",
    "check_ghost_supported",
    "ghost_container",
    "ghost_parameter_free",
    "supports",
]

ModuleT = TypeVar("ModuleT", bound=type[nn.Module])

# Containers whose forward only calls child modules (never reads a child's parameters directly).
GHOST_CONTAINERS: set[type[nn.Module]] = {nn.Sequential, nn.ModuleList}

# Parameter-free modules that treat rows independently and keep dimension 0 as the batch
# (Flatten/Unflatten are further checked for the dimensions they touch).
GHOST_PARAMETER_FREE: set[type[nn.Module]] = set(PARAMETER_FREE_MODULES)


def _flatten_refusal(module: nn.Flatten) -> str | None:
    if module.start_dim < 1:
        return (
            f"has start_dim={module.start_dim}: the ghost clipping engine needs dimension 0 "
            "to stay the batch (use start_dim >= 1)"
        )
    return None


def _unflatten_refusal(module: nn.Unflatten) -> str | None:
    if not isinstance(module.dim, int) or module.dim < 1:
        return f"has dim={module.dim!r}: the ghost clipping engine needs dimension 0 to stay the batch (use dim >= 1)"
    return None


def _dropout_refusal(module: nn.Dropout) -> str | None:
    if module.p != 0:
        return f"has p={module.p}: a random forward differs per call; the ghost clipping engine needs p = 0"
    return None


# Dropout with p = 0 is an identity (the hf builder sets every dropout probability to 0).
GHOST_PARAMETER_FREE.add(nn.Dropout)

# Containers and parameter-free modules accepted only in some configurations: reason worded as for
# a layer rule.
_STRUCTURE_REFUSALS: dict[type[nn.Module], Callable[[nn.Module], str | None]] = {
    nn.Flatten: _flatten_refusal,  # type: ignore[dict-item]
    nn.Unflatten: _unflatten_refusal,  # type: ignore[dict-item]
    nn.Dropout: _dropout_refusal,  # type: ignore[dict-item]
}


def _add_refusal(cls: type[nn.Module], refusal: Refusal[nn.Module] | None) -> None:
    if refusal is not None:
        if cls in _STRUCTURE_REFUSALS:
            raise ValueError(f"a ghost clipping refusal for {cls.__name__} is registered twice")
        _STRUCTURE_REFUSALS[cls] = refusal


def ghost_container(cls: ModuleT, *, refusal: Refusal[nn.Module] | None = None) -> ModuleT:
    """Class decorator: allow a zoo-internal container (e.g. a residual block) in the ghost engine.

    Register a class only if its forward treats rows independently, keeps dimension 0 as the
    batch, and touches its children's parameters ONLY by calling the children (no
    `F.linear(x, self.fc.weight)`); it must own no parameters itself. Children are checked
    separately. `refusal` names the configurations where that does not hold (checked on every
    instance before any computation). (It must also be registered with per_sample.supported_module
    for the vmap engine.)
    """
    GHOST_CONTAINERS.add(cls)
    _add_refusal(cls, refusal)
    return cls


def ghost_parameter_free(cls: ModuleT, *, refusal: Refusal[nn.Module] | None = None) -> ModuleT:
    """Allow a parameter-free module (an activation, a rotary table) that acts on each row alone,
    keeps dimension 0 as the batch and draws no randomness; `refusal` as for `ghost_container`."""
    GHOST_PARAMETER_FREE.add(cls)
    _add_refusal(cls, refusal)
    return cls


def _allowed_parameters(module: nn.Module, where: str) -> tuple[str, ...]:
    """The parameter attributes `module` may own, or ValueError if the engine cannot take it."""
    kind = type(module)
    rule = GHOST_LAYERS.rule_for(module)
    if rule is not None:
        refusal = rule.refusal
    elif kind in GHOST_CONTAINERS or kind in GHOST_PARAMETER_FREE:
        refusal = _STRUCTURE_REFUSALS.get(kind)
    else:
        raise ValueError(f"module {where} of type {kind.__name__} is not supported by the ghost clipping engine")
    reason = refusal(module) if refusal is not None else None
    if reason is not None:
        raise ValueError(f"module {where} ({kind.__name__}) {reason}")
    return rule.parameters if rule is not None else ()


def _covered(allowed: tuple[str, ...]) -> str:
    """What a layer's rule covers, for the refusal: "the weight/bias" unless it says otherwise."""
    return "the " + "/".join(allowed or ("weight", "bias"))


def check_ghost_supported(model: nn.Module) -> None:
    """Raise ValueError naming the first module the ghost engine cannot handle exactly."""
    load_optional_families()
    owners: dict[int, tuple[nn.Module, str]] = {}  # a reused layer is fine, tied params not
    for name, module in model.named_modules(remove_duplicate=False):
        where = name or "<root>"
        kind = type(module)
        if getattr(module, "_compiled_call_impl", None) is not None:  # set by nn.Module.compile()
            raise ValueError(
                f"module {where} ({kind.__name__}) is compiled with torch.compile: the ghost clipping "
                "engine's hooks do not see its layers' calls"
            )
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ValueError(
                f"module {where} is {kind.__name__}: BatchNorm mixes samples and is not "
                "supported with DP; use GroupNorm"
            )
        allowed = _allowed_parameters(module, where)
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if pname not in allowed:
                raise ValueError(
                    f"parameter {pname!r} of module {where} ({kind.__name__}) is not "
                    f"{_covered(allowed)} of a layer the ghost clipping engine supports"
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
