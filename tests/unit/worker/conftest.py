"""Shared fixtures of the worker's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """The tensors here are tiny: one thread is faster (thread hand-offs cost more than they
    save) and immune to a busy shared CPU. Results do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
