"""The Hugging Face ViT (``model_type: vit``) in the ghost engine: a rule for its embeddings' bare
parameters, and its containers.

``ViTEmbeddings`` computes ``dropout(cat(cls_token, patch_embeddings(x)) + position_embeddings)``
(read in Transformers 5.24; the builder sets the dropout to 0, and the zoo's ``HFImageModel``
never asks for interpolated position embeddings). So row i's gradients are its output gradient at
position 0 for ``cls_token`` (1, 1, d) and its whole (T, d) output gradient for
``position_embeddings`` (1, T, d): both small, materialised as the zoo ViT's own rules
(`tokens`) do. The patch projection is an ``nn.Conv2d`` child with its own exact rule; a trainable
``mask_token`` (masked image modelling, never built here) is refused by the parameter check.

The containers (``ViTForImageClassification``, ``ViTModel``, its layers, attention, MLP and patch
embeddings) only call their children, keep rows apart (no mask: every patch is real) and own no
parameters; the classifier reads each row's own CLS position. They are refused in the
configurations `hf_containers` refuses (gradient checkpointing, attention other than eager, an
attention dropout above 0).

Imported by `optional.load_optional_families` only once the process has imported Transformers.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.vit import modeling_vit as vit

from dp.per_example.ghost.hf_containers import container_refusal
from dp.per_example.ghost.registry import ghost_layer
from dp.per_example.ghost.support import ghost_container
from dp.per_example.ghost.work import Calls, LayerWork, ParamNames, materialised_work
from dp.per_example.per_sample import supported_module

__all__ = ["VIT_CONTAINERS", "vit_embeddings_work"]

VIT_CONTAINERS: tuple[type[nn.Module], ...] = (
    vit.ViTForImageClassification,
    vit.ViTModel,
    vit.ViTPatchEmbeddings,
    vit.ViTLayer,
    vit.ViTAttention,
    vit.ViTMLP,
)


def _images_to_tokens(module: nn.Module, inp: torch.Tensor, out: torch.Tensor, batch: int) -> bool:
    """(B, C, H, W) images in, (B, T, d) tokens out."""
    return inp.dim() == 4 and out.dim() == 3 and inp.shape[0] == batch and out.shape[0] == batch


def _summed(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


@ghost_layer(vit.ViTEmbeddings, keeps_rows=_images_to_tokens, parameters=("cls_token", "position_embeddings"))
def vit_embeddings_work(module: vit.ViTEmbeddings, names: ParamNames, calls: Calls, *, bk: bool) -> LayerWork:
    """g_i(cls_token) = δ_i0, g_i(position_embeddings) = δ_i, each shaped (B, *parameter.shape)."""
    grads: dict[str, torch.Tensor] = {}
    if names["cls_token"] is not None:
        grads[names["cls_token"]] = _summed([d[:, None, :1, :] for _, d in calls])
    if names["position_embeddings"] is not None:
        grads[names["position_embeddings"]] = _summed([d[:, None] for _, d in calls])
    return materialised_work(grads)


supported_module(vit.ViTEmbeddings)
for _container in VIT_CONTAINERS:
    ghost_container(supported_module(_container), refusal=container_refusal)
