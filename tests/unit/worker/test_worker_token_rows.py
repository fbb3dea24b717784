"""A text dataset's token ids (dp/data/tokens.py): memory-mapped or resident on the device,
``take`` hands back the same int64 rows, a hold-out subset reads through, and language-model
targets are the ids with every pad position ignored (-100)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dp.data.rows import Rows, SubsetRows
from dp.data.tokens import IGNORED_TARGET, TokenRows, language_model_targets, open_token_array

PAD = 256


def _stored(tmp_path: Path, dtype: str = "<u2", n: int = 30, width: int = 7) -> tuple[np.ndarray, Path]:
    array = np.random.default_rng(0).integers(0, 259, size=(n, width)).astype(dtype)
    array[::3, 4:] = PAD  # right padding on some rows
    path = tmp_path / "tokens.npy"
    np.save(path, array, allow_pickle=False)
    return array, path


@settings(max_examples=25, deadline=None)
@given(index=st.lists(st.integers(0, 29), max_size=10), dtype=st.sampled_from(["<u2", "<i4"]))
def test_every_placement_returns_the_same_int64_rows(
    tmp_path_factory: pytest.TempPathFactory, index: list[int], dtype: str
) -> None:
    array, path = _stored(tmp_path_factory.mktemp("tokens"), dtype)
    wanted = torch.tensor(index, dtype=torch.int64)
    mapped = TokenRows.placed(path, max_length=7, device=torch.device("cpu"), max_device_fraction=0.3)
    resident = TokenRows(open_token_array(path), device="cpu", resident=True)
    assert not mapped.resident and resident.resident
    for rows in (mapped, resident):
        assert isinstance(rows, Rows) and rows.n_rows == 30 and rows.row_shape == (7,)
        got = rows.take(wanted)
        assert got.dtype == torch.int64 and got.shape == (len(index), 7)
        assert torch.equal(got, torch.from_numpy(array[index].astype(np.int64)))


def test_the_memory_mapped_array_is_not_read_whole(tmp_path: Path) -> None:
    _array, path = _stored(tmp_path)
    assert isinstance(open_token_array(path), np.memmap)


def test_a_subset_reads_through_to_the_kept_rows(tmp_path: Path) -> None:
    array, path = _stored(tmp_path)
    subset = SubsetRows(TokenRows(open_token_array(path)), np.array([2, 9, 29]))
    assert torch.equal(subset.take(torch.tensor([2, 0])), torch.from_numpy(array[[29, 2]].astype(np.int64)))


def test_language_model_targets_ignore_every_pad(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("dp.data.tokens.COPY_CHUNK_ROWS", 4)  # several chunks
    array, path = _stored(tmp_path)
    targets = language_model_targets(TokenRows(open_token_array(path)), pad_id=PAD)
    expected = np.where(array == PAD, IGNORED_TARGET, array.astype(np.int64))
    assert targets.dtype == torch.int64 and torch.equal(targets, torch.from_numpy(expected))


def test_a_wrong_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "floats.npy"
    np.save(path, np.zeros((3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="token array"):
        open_token_array(path)
    _array, ids = _stored(tmp_path)
    with pytest.raises(ValueError, match="not the dataset's 8"):
        open_token_array(ids, max_length=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_ids_are_copied_to_the_device_when_they_fit(tmp_path: Path) -> None:
    array, path = _stored(tmp_path)
    rows = TokenRows.placed(path, max_length=7, device=torch.device("cuda"), max_device_fraction=0.3)
    assert rows.resident and rows.take(torch.tensor([1, 3])).device.type == "cuda"
    assert torch.equal(rows.take(torch.tensor([1, 3])).cpu(), torch.from_numpy(array[[1, 3]].astype(np.int64)))
    mapped = TokenRows.placed(path, max_length=7, device=torch.device("cuda"), max_device_fraction=0.0)
    assert not mapped.resident and torch.equal(
        mapped.take(torch.tensor([1, 3])).cpu(), rows.take(torch.tensor([1, 3])).cpu()
    )
