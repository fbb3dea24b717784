"""The model zoo's torch modules: every architecture a job may name, built by name.

No user code is ever executed: a job names a model and gives plain JSON parameters, and the
worker (and anyone loading a downloaded artifact) rebuilds the exact module from that name and
those parameters. Every model is built only from layers the per-sample gradient engines support
(`dp.per_example.per_sample.SUPPORTED_MODULES`, and the zoo's own layers below, which the
worker registers with both engines in `dp.per_example.ghost.zoo`); there is no BatchNorm,
whose batch statistics would mix samples and break per-sample clipping.

Initialisation is PyTorch's default, made reproducible by the `generator` argument of
`build_model` (see there).

Every model also declares its fine-tuning blocks (`FINETUNE_BLOCKS`): the units
`training.finetune: last_k_blocks` counts from the end, each named and mapped to the children of
the model that it spans. Together they hold every parameter exactly once. The zoo's torch-free table
(`privtrain_common.zoo.catalogue`) lists the same names from the params alone, so the service checks
`finetune_k` at submission; tests pin the two against each other.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

# Each family's builder module registers its builders in MODEL_REGISTRY when imported.
from privtrain_common.zoo.building import (
    ACTIVATIONS,
    FINETUNE_BLOCKS,
    MODEL_REGISTRY,
    ModelBuilder,
    check_input_shape,
    check_positive_int,
    declare_blocks,
    register_model,
)
from privtrain_common.zoo.cnn2 import builder as _cnn2  # noqa: F401  (registers cnn2-gn)
from privtrain_common.zoo.dense import builder as _dense  # noqa: F401  (registers the dense models)
from privtrain_common.zoo.hf import builder as _hf  # noqa: F401  (registers hf; Transformers loads when one is built)
from privtrain_common.zoo.hf.builder import HFImageModel, HFModel
from privtrain_common.zoo.images import builder as _images  # noqa: F401  (registers the image zoo)
from privtrain_common.zoo.layers import (
    ZOO_CONTAINERS,
    ZOO_LAYERS,
    FirstToken,
    PatchTokens,
    PositionalEmbedding,
    Residual,
    SelfAttention,
    TextTransformer,
    TokenPrepend,
    TransformerBlock,
    WSConv2d,
)
from privtrain_common.zoo.text import builder as _text  # noqa: F401  (registers the text models)

__all__ = [
    "ACTIVATIONS",
    "FINETUNE_BLOCKS",
    "MODEL_REGISTRY",
    "ZOO_CONTAINERS",
    "ZOO_LAYERS",
    "FirstToken",
    "HFImageModel",
    "HFModel",
    "ModelBuilder",
    "PatchTokens",
    "PositionalEmbedding",
    "Residual",
    "SelfAttention",
    "TextTransformer",
    "TokenPrepend",
    "TransformerBlock",
    "WSConv2d",
    "build_model",
    "declare_blocks",
    "register_model",
]


def build_model(
    name: str,
    params: Mapping[str, object],
    *,
    input_shape: tuple[int, ...],
    n_outputs: int,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Build the registered model `name` on the CPU.

    `generator` is a plain `torch.Generator`, deliberately NOT the job's SecureRandom: init is
    data-independent and must not share (or consume) the noise stream, so the runner seeds its own
    generator from os.urandom. It makes initialisation reproducible without changing PyTorch's default init
    distributions: one 63-bit seed is drawn from it and the layers are constructed under
    `torch.random.fork_rng` with the CPU default generator seeded by that seed, so the caller's
    global RNG state is left exactly as it was. (fork_rng touches process-global state, so do not
    build models concurrently from several threads.) With `generator=None` the global CPU RNG is
    used as PyTorch normally does. Initialisation is data-independent, so it needs no secret seed.
    """
    builder = MODEL_REGISTRY.get(name)
    if builder is None:
        known = ", ".join(sorted(MODEL_REGISTRY))
        raise ValueError(f"unknown model {name!r}; known models: {known}")
    shape = check_input_shape(input_shape)
    outputs = check_positive_int("n_outputs", n_outputs)
    if not isinstance(params, Mapping):
        raise ValueError(f"model params must be a mapping, got {type(params).__name__}")
    if generator is None:
        return builder(params, input_shape=shape, n_outputs=outputs)
    if not isinstance(generator, torch.Generator):
        raise TypeError("build_model takes its own torch.Generator, never the job's noise stream")
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device).item())
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return builder(params, input_shape=shape, n_outputs=outputs)
