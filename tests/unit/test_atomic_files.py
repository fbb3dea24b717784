"""Atomic writes, and finding the temp files of a write that was killed."""

from __future__ import annotations

from pathlib import Path

import pytest

from privtrain_common.atomic_files import unfinished_writes, write_atomically


def test_a_finished_write_replaces_the_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state.safetensors"
    target.write_bytes(b"old")
    digest = write_atomically(target, b"new")
    assert target.read_bytes() == b"new" and len(digest) == 64
    assert sorted(path.name for path in tmp_path.iterdir()) == ["state.safetensors"]


def test_unfinished_writes_finds_a_killed_writes_temp_file_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "job_[1].safetensors"  # glob characters in the name are matched literally
    neighbour = tmp_path / "job_[1].safetensors.bak"
    neighbour.write_bytes(b"someone else's")
    write_atomically(target, b"done")
    assert unfinished_writes(target) == []  # a finished write leaves only the file

    def killed(*_args: object) -> None:
        raise KeyboardInterrupt  # stands for SIGKILL: the rename never happens...

    monkeypatch.setattr("privtrain_common.atomic_files.os.replace", killed)
    monkeypatch.setattr("privtrain_common.atomic_files.os.unlink", lambda _name: None)  # ...nor the cleanup
    with pytest.raises(KeyboardInterrupt):
        write_atomically(target, b"secret bytes")
    (leftover,) = unfinished_writes(target)
    assert leftover.read_bytes() == b"secret bytes" and leftover.parent == tmp_path
    assert target.read_bytes() == b"done" and neighbour.exists()
    assert unfinished_writes(tmp_path / "job_1.safetensors") == []
