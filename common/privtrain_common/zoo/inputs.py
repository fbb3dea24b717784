"""What a zoo model reads of the data it is given: the public facts of a dataset's rows.

The service passes its own dataset facts; anything with these attributes will do (a base-model
upload, which has no dataset, passes facts that stand for any dataset its weights fit).
"""

from __future__ import annotations

from typing import Protocol


class InputFacts(Protocol):
    """The public shape of a dataset's rows, and a text dataset's vocabulary."""

    @property
    def feature_shape(self) -> tuple[int, ...]: ...

    @property
    def n_features(self) -> int: ...

    @property
    def vocab_size(self) -> int | None:
        """Text datasets: the tokenizer's vocabulary size (token ids are below it); None otherwise."""

    @property
    def pad_id(self) -> int | None:
        """Text datasets: the id rows are right-padded with; None otherwise."""


def image_chw(facts: InputFacts) -> tuple[int, int, int] | None:
    """(C, H, W) of the images the model receives, None when the rows are not images.

    A 3-D feature shape is channels-first, (C, H, W): an NPZ of floats with X of shape
    (n, C, H, W), and an image dataset, whose public feature shape is the layout the worker feeds
    the model (its uint8 array is stored channels-last and transposed batch by batch).
    """
    if len(facts.feature_shape) != 3:
        return None
    channels, height, width = facts.feature_shape
    return channels, height, width
