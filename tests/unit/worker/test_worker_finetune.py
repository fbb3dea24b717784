"""Fine-tuning modes (training/finetune.py) and init loading (training/init_weights.py):
frozen parameters have no per-sample gradient in either DP engine, and the two engines agree."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from dp.loop.batch_loop import PerSampleMapAggregator
from dp.per_example.ghost import GhostClipAggregator
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model
from training.finetune import apply_finetune, block_names, head_parameter_names
from training.init_weights import apply_init, load_into


def _mlp(hidden: list[int], n_outputs: int = 3, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    return build_model("mlp", {"hidden_sizes": hidden}, input_shape=(6,), n_outputs=n_outputs, generator=generator)


def test_head_and_blocks_are_found_generically() -> None:
    model = _mlp([5, 4])
    assert head_parameter_names(model) == {"5.weight", "5.bias"}
    assert block_names(model) == ["hidden1", "hidden2", "head"]  # each Linear (declared by the zoo)
    cnn = build_model("cnn2-gn", {}, input_shape=(1, 14, 14), n_outputs=3)
    head = head_parameter_names(cnn)
    assert head and all(name.endswith(("weight", "bias")) for name in head)
    assert apply_finetune(cnn, mode="head") == sum(p.numel() for n, p in cnn.named_parameters() if n in head)


@pytest.mark.parametrize(("mode", "k", "trainable"), [("full", None, 6), ("head", None, 2), ("last_k_blocks", 2, 4)])
def test_modes_freeze_the_rest(mode: str, k: int | None, trainable: int) -> None:
    model = _mlp([5, 4])
    apply_finetune(model, mode=mode, k=k)  # type: ignore[arg-type]
    assert sum(1 for p in model.parameters() if p.requires_grad) == trainable
    with pytest.raises(ValueError, match="finetune_k"):
        apply_finetune(_mlp([5]), mode="last_k_blocks", k=3)


def test_both_engines_skip_frozen_parameters_and_agree() -> None:
    model = _mlp([5, 4]).double()
    apply_finetune(model, mode="last_k_blocks", k=2)
    X, y = torch.randn(9, 6, dtype=torch.float64), torch.randint(0, 3, (9,))
    clip = AbadiClip(0.5)
    sums = [
        aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=4, generator=SecureRandom.from_seed(0)
        )
        for aggregator in (GhostClipAggregator(clip), PerSampleMapAggregator(clip))
    ]
    assert set(sums[0]) == set(sums[1]) == {"3.weight", "3.bias", "5.weight", "5.bias"}
    for name, value in sums[1].items():
        torch.testing.assert_close(sums[0][name], value, rtol=1e-9, atol=1e-12)


def test_init_loads_everything_but_a_resized_head(tmp_path) -> None:  # noqa: ANN001
    source = _mlp([5], n_outputs=3, seed=1)
    path = tmp_path / "init.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    same = _mlp([5], n_outputs=3, seed=2)
    assert apply_init(same, path) == []
    assert all(torch.equal(same.state_dict()[k], v) for k, v in source.state_dict().items())
    wider = _mlp([5], n_outputs=7, seed=2)
    assert sorted(apply_init(wider, path)) == ["3.bias", "3.weight"]  # a new head, kept fresh
    assert torch.equal(wider.state_dict()["1.weight"], source.state_dict()["1.weight"])
    with pytest.raises(ValueError, match=r"1\.weight"):
        load_into(_mlp([6]), {k: v for k, v in source.state_dict().items()})


ZOO_IMAGES = {  # tiny configurations of the image zoo (3x8x8 inputs)
    "wrn": {"depth": 10, "width": 1},
    "resnet-gn": {},
    "cnn": {"channels": [4, 8], "groups": 2},
    "vit": {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 16},
}


@pytest.mark.parametrize("name", sorted(ZOO_IMAGES))
@pytest.mark.parametrize(("mode", "k"), [("head", None), ("last_k_blocks", 2)])
def test_every_image_zoo_model_fine_tunes_with_both_engines(name: str, mode: str, k: int | None) -> None:
    model = build_model(name, ZOO_IMAGES[name], input_shape=(3, 8, 8), n_outputs=3).double()
    apply_finetune(model, mode=mode, k=k)  # type: ignore[arg-type]
    X, y = torch.randn(5, 3, 8, 8, dtype=torch.float64), torch.randint(0, 3, (5,))
    sums = [
        aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=4, generator=SecureRandom.from_seed(0)
        )
        for aggregator in (GhostClipAggregator(AbadiClip(0.5)), PerSampleMapAggregator(AbadiClip(0.5)))
    ]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(sums[0]) == set(sums[1]) == trainable and head_parameter_names(model) <= trainable
    for param_name, value in sums[1].items():
        torch.testing.assert_close(sums[0][param_name], value, rtol=1e-7, atol=1e-10)
