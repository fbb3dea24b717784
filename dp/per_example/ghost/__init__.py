"""Ghost clipping / book-keeping: Σ_i scale_i·g_i without a per-sample gradient for every parameter.

Same result as the vmap engine (`dp.per_example.per_sample.clipped_grad_sum`) up to
floating-point rounding (tests pin ~1e-5 relative in float32, 1e-10 in float64), for the models
`supports` accepts. The result is private: release it through noise only.

How (Goodfellow 2015; Li et al. 2022 "ghost clipping"; Bu et al. 2023 "book-keeping", BK): pass 1
records every trainable layer's input a and output gradient δ with one forward and one cheap
backward; each layer's rule turns (a, δ) into that layer's per-sample squared norms, summed to
the joint flat norm; pass 2 forms Σ_i scale_i·g_i, by default from the same records.

Modules, one job each:

- `api`: the entry points (`ghost_per_sample_norms`, `ghost_clipped_grad_sum` and its pass-2
  modes, `ghost_weighted_grad_sums`, `iter_ghost_per_sample_grads`, `GhostClipAggregator`).
- `engine`: the chunked pass 1; `recorder`: its forward hooks and run-time checks.
- `support`: `check_ghost_supported` / `supports` on the module tree; `ghost_container`,
  `ghost_parameter_free`.
- `registry`: `GHOST_LAYERS` and the `@ghost_layer(...)` decorator, one rule per layer type;
  `work`: what a rule returns (`LayerWork`) and the helpers rules share.
- Layer families, each registering its rules: `linear_conv` (Linear, Conv1d, Conv2d), `norms`
  (GroupNorm, LayerNorm), `embedding` (Embedding), `standardised_conv` (the zoo's
  weight-standardised conv), `tokens` (the ViT's class token and positional embedding).
  Supporting another layer is one new module like these, imported below.
- `zoo`: the zoo's containers (residual blocks, attention, transformer blocks) registered with
  both engines.
- `optional`: the families of optional libraries, imported once the process has imported the
  library: `hf_layers` (Transformers' Conv1D, Llama/Qwen2 RMSNorm) and `hf_containers` (the `hf`
  model families' containers, activations and rotary tables, and the zoo's `HFModel`).
"""

from __future__ import annotations

# Each layer family registers its rules in GHOST_LAYERS when imported.
from dp.per_example.ghost import embedding, linear_conv, norms, standardised_conv, tokens, zoo  # noqa: F401
from dp.per_example.ghost.api import (
    PASS2_MODES,
    GhostClipAggregator,
    Pass2,
    ghost_clipped_grad_sum,
    ghost_per_sample_norms,
    ghost_weighted_grad_sums,
    iter_ghost_per_sample_grads,
)
from dp.per_example.ghost.registry import GHOST_LAYERS, GhostLayerRule, ghost_layer
from dp.per_example.ghost.support import (
    GHOST_CONTAINERS,
    GHOST_PARAMETER_FREE,
    check_ghost_supported,
    ghost_container,
    ghost_parameter_free,
    supports,
)
from dp.per_example.ghost.work import MATERIALISE_MAX_ELEMENTS

__all__ = [
    "GHOST_CONTAINERS",
    "GHOST_LAYERS",
    "GHOST_PARAMETER_FREE",
    "MATERIALISE_MAX_ELEMENTS",
    "PASS2_MODES",
    "GhostClipAggregator",
    "GhostLayerRule",
    "Pass2",
    "check_ghost_supported",
    "ghost_clipped_grad_sum",
    "ghost_container",
    "ghost_layer",
    "ghost_parameter_free",
    "ghost_per_sample_norms",
    "ghost_weighted_grad_sums",
    "iter_ghost_per_sample_grads",
    "supports",
]
