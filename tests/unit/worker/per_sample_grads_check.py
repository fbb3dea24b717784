"""The ghost engine's per-sample gradients against the vmap engine's, row for row.

Shared by the ghost tests of the layer rules, the image zoo and the text models, so every rule a
test forces (Gram or materialised, reused and frozen layers) is
checked for `iter_ghost_per_sample_grads` too, not only for the norms and sums.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from dp.per_example.ghost import iter_ghost_per_sample_grads
from dp.per_example.per_sample import iter_per_sample_grads, per_sample_norms, trainable_parameters


def _rows(chunks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.cat([chunk[name] for chunk in chunks]) for name in chunks[0]}


def assert_ghost_per_sample_grads_match(
    model: nn.Module, X: torch.Tensor, y: torch.Tensor, loss: str, *, chunk: int, tol: float
) -> None:
    """Same names, order, shapes and dtypes; each finite row's gradient within `tol` of its norm
    (rows with a non-finite gradient: both engines say non-finite). The model is left unhooked."""
    reference = _rows(list(iter_per_sample_grads(copy.deepcopy(model), X, y, loss=loss, max_physical_batch_size=4)))
    got = _rows(list(iter_ghost_per_sample_grads(model, X, y, loss=loss, max_physical_batch_size=chunk)))
    assert list(got) == list(reference) == list(trainable_parameters(model))
    ref_norms = per_sample_norms(reference)
    finite = torch.isfinite(ref_norms)
    assert torch.equal(torch.isfinite(per_sample_norms(got)), finite)
    row_scale = ref_norms[finite] + 1e-30
    for name, r in reference.items():
        g = got[name]
        assert g.shape == r.shape and g.dtype == r.dtype, name
        error = (g[finite] - r[finite]).reshape(int(finite.sum()), -1).norm(dim=1)
        assert bool((error <= tol * row_scale).all()), (name, float((error / row_scale).max()))
    assert not any(m._forward_hooks for m in model.modules())
