"""The worker's view of an image dataset: the stored uint8 (n, H, W, C) array, memory-mapped,
becomes float32 x / 255 in the models' (C, H, W) layout, chunk by chunk, never unpickled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dp.data.images import ImageRows, normalise
from dp.data.rows import MappedImageRows, materialise


def _stored(tmp_path: Path, array: np.ndarray) -> Path:
    path = tmp_path / "images.npy"
    np.save(path, array, allow_pickle=False)
    return path


def test_a_batch_is_normalised_channels_first_and_reads_only_its_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, size=(7, 4, 5, 3), dtype=np.uint8)
    rows = ImageRows(_stored(tmp_path, array), shape=(3, 4, 5))
    assert rows.n_rows == 7 and rows.model_shape == (3, 4, 5)
    batch = rows.batch(np.array([5, 1]))
    assert batch.dtype == torch.float32 and batch.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(batch[0].numpy(), array[5].transpose(2, 0, 1) / 255.0, rtol=1e-6)
    assert float(normalise(np.full((1, 1, 1, 1), 255, np.uint8))) == 1.0


def test_the_whole_array_converted_in_chunks_equals_one_conversion(tmp_path: Path) -> None:
    array = np.arange(10 * 2 * 2 * 1, dtype=np.uint8).reshape(10, 2, 2, 1)
    converted = materialise(MappedImageRows(ImageRows(_stored(tmp_path, array))), chunk_rows=3)
    torch.testing.assert_close(converted, normalise(array))


@pytest.mark.parametrize(
    ("array", "shape"),
    [
        (np.zeros((2, 3, 3, 1), dtype=np.float32), None),  # not uint8
        (np.zeros((2, 3, 3), dtype=np.uint8), None),  # not (n, H, W, C)
        (np.zeros((2, 3, 3, 1), dtype=np.uint8), (3, 3, 3)),  # not the dataset's shape
    ],
)
def test_an_array_that_is_not_the_datasets_images_is_refused(
    tmp_path: Path, array: np.ndarray, shape: tuple[int, int, int] | None
) -> None:
    with pytest.raises(ValueError):
        ImageRows(_stored(tmp_path, array), shape=shape)


def test_a_pickled_array_is_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        ImageRows(path)
