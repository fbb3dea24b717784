"""Where a job's rows live (dp/data/rows.py): in memory, on the device or memory-mapped, every
placement hands the trainers the same float rows, and the memory-mapped one reads only the rows a
step sampled, so a dataset larger than memory trains."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.data.images import ImageRows, normalise
from dp.data.rows import (
    DeviceImageRows,
    MappedImageRows,
    SubsetRows,
    TensorRows,
    materialise,
    place_image_rows,
)
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model


def _images(tmp_path: Path, n: int = 40, seed: int = 0) -> tuple[np.ndarray, ImageRows]:
    array = np.random.default_rng(seed).integers(0, 256, size=(n, 6, 6, 1), dtype=np.uint8)
    path = tmp_path / "images.npy"
    np.save(path, array, allow_pickle=False)
    return array, ImageRows(path, shape=(1, 6, 6))


@settings(max_examples=25, deadline=None)
@given(index=st.lists(st.integers(0, 39), max_size=12))
def test_every_placement_returns_the_same_rows(tmp_path_factory: pytest.TempPathFactory, index: list[int]) -> None:
    array, images = _images(tmp_path_factory.mktemp("rows"))
    wanted = torch.tensor(index, dtype=torch.int64)
    expected = normalise(array[index]) if index else torch.empty((0, 1, 6, 6))
    for rows in (
        MappedImageRows(images),
        DeviceImageRows.copy_of(images, torch.device("cpu")),
        TensorRows(normalise(array)),
    ):
        got = rows.take(wanted)
        assert got.dtype == torch.float32 and got.shape == (len(index), 1, 6, 6)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_subset_reads_through_to_the_positions_it_keeps(tmp_path: Path) -> None:
    array, images = _images(tmp_path)
    kept = np.array([3, 7, 11, 39])
    subset = SubsetRows(MappedImageRows(images), kept)
    assert subset.n_rows == 4 and subset.row_shape == (1, 6, 6)
    torch.testing.assert_close(subset.take(torch.tensor([2, 0])), normalise(array[[11, 3]]))
    torch.testing.assert_close(materialise(subset, chunk_rows=3), normalise(array[kept]))


def test_on_the_cpu_an_image_dataset_stays_memory_mapped(tmp_path: Path) -> None:
    _array, images = _images(tmp_path)
    placed = place_image_rows(images, torch.device("cpu"), max_device_fraction=0.9)
    assert isinstance(placed, MappedImageRows) and placed.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_small_dataset_is_copied_to_the_device_once(tmp_path: Path) -> None:
    array, images = _images(tmp_path)
    device = torch.device("cuda")
    placed = place_image_rows(images, device, max_device_fraction=0.3)
    assert isinstance(placed, DeviceImageRows) and placed.device.type == "cuda"
    torch.testing.assert_close(placed.take(torch.tensor([5], device=device)).cpu(), normalise(array[[5]]))
    assert isinstance(place_image_rows(images, device, max_device_fraction=0.0), MappedImageRows)


def _train(X: torch.Tensor | MappedImageRows, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model = build_model(
        "cnn", {"channels": [2], "groups": 1}, input_shape=(1, 6, 6), n_outputs=2,
        generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    config = DPSGDConfig(steps=4, sampling_probability=0.25, noise_multiplier=1.0, clipping_norm=1.0, learning_rate=0.1)
    result = train_dp_sgd(model, X, y, config=config, generator=SecureRandom.from_seed(7))
    assert result.steps_run == 4
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_training_from_the_memory_map_reads_only_sampled_rows_and_matches_in_memory_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    array, images = _images(tmp_path)
    y = torch.from_numpy(np.arange(40) % 2)
    reads: list[int] = []
    raw = ImageRows.raw

    def counting_raw(self: ImageRows, index: np.ndarray | slice) -> np.ndarray:
        out = raw(self, index)
        reads.append(int(out.shape[0]))
        return out

    monkeypatch.setattr(ImageRows, "raw", counting_raw)
    from_disk = _train(MappedImageRows(images), y)
    assert len(reads) == 4  # one read per step, of that step's Poisson batch only
    assert max(reads) < 40 and sum(reads) < 40 * 4
    in_memory = _train(normalise(array), y)  # the same draws on the same rows: the same model
    for name, value in in_memory.items():
        torch.testing.assert_close(from_disk[name], value, rtol=0, atol=0)
