"""bench/gram_choice.py records the engine's own per-layer choice: it mocks the rules' form picker,
so a change of that picker's signature must show here, not first on a GPU loan."""

from __future__ import annotations

import torch

from bench.gram_choice import CASES, _picks_gram, _record
from dp.per_example.ghost import linear_conv


def test_every_two_form_layer_is_recorded_with_what_the_engine_would_pick() -> None:
    layers = _record(CASES["cnn2-gn"], torch.device("cpu"), 4)
    assert sorted(layer.shape[2:] for layer in layers) == [(25, 256, 32), (196, 64, 16)]  # (T, k, o) of both convs
    assert all(layer.patches for layer in layers)  # 8×8 and 4×4 kernels: the patches are copies
    assert not any(layer.patch_sum for layer in layers)  # a conv's Gram form sums with its own kernel
    current = linear_conv.WRITE_COST_FLOPS["cpu"]
    for layer in layers:
        batch, groups, positions, k, o = layer.shape
        engine = linear_conv._use_gram(
            batch, groups, positions, k, o, bk=True, device_type="cpu", patches=True, patch_sum=False
        )
        assert _picks_gram(layer, current) == engine
        layer.materialised()  # both forms run on the recorded tensors
        layer.gram()
