"""logistic-regression, linear-regression and mlp, described without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from privtrain_common.zoo.entry import ModelIncompatible, ModelSize, ZooEntry
from privtrain_common.zoo.inputs import InputFacts
from privtrain_common.zoo.params import list_param


@dataclass(frozen=True, kw_only=True)
class NoParams:
    pass


@dataclass(frozen=True, kw_only=True)
class MLPParams:
    hidden_sizes: list[int] = list_param((128,), min_length=1, max_length=8)
    activation: Literal["tanh", "relu"] = "tanh"

    def __post_init__(self) -> None:
        if any(size < 1 or size > 16384 for size in self.hidden_sizes):
            raise ValueError("hidden_sizes entries must be between 1 and 16384")


def _numeric_features(_params: object, facts: InputFacts) -> None:
    """Any shape of numbers (flattened); token ids are not: their values are names, not magnitudes."""
    if facts.vocab_size is not None:
        raise ModelIncompatible(
            "this model reads its features as numbers, and a text dataset's rows are token ids (their "
            "values name tokens, they do not measure anything); use transformer-classifier for text "
            "classification or transformer-lm for language modelling"
        )


def _head_only(_params: NoParams) -> list[str]:
    """Logistic and linear regression: one Linear, the head."""
    return ["head"]


def _mlp_blocks(params: MLPParams) -> list[str]:
    """One block per Linear: each hidden layer, then the head."""
    return [*(f"hidden{number}" for number in range(1, len(params.hidden_sizes) + 1)), "head"]


def _linear_size(_params: NoParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    """Flatten → Linear(d, k): logistic and linear regression."""
    d = facts.n_features
    return ModelSize(parameters=d * n_outputs + n_outputs, activations=d + n_outputs)


def _mlp_size(params: MLPParams, facts: InputFacts, n_outputs: int) -> ModelSize:
    """Flatten → (Linear, activation) per hidden size → Linear(last, k)."""
    width, parameters, activations = facts.n_features, 0, facts.n_features
    for size in [*params.hidden_sizes, n_outputs]:
        parameters += width * size + size
        activations += 2 * size  # the Linear's output and the activation's
        width = size
    return ModelSize(parameters=parameters, activations=activations - n_outputs)


ENTRIES = (
    ZooEntry(
        name="logistic-regression",
        summary="Multinomial logistic regression on the flattened features.",
        params=NoParams,
        tasks=frozenset({"classification"}),
        check_shape=_numeric_features,
        size=_linear_size,
        blocks=_head_only,
    ),
    ZooEntry(
        name="linear-regression",
        summary="Linear regression (squared loss) on the flattened features.",
        params=NoParams,
        tasks=frozenset({"regression"}),
        check_shape=_numeric_features,
        size=_linear_size,
        blocks=_head_only,
    ),
    ZooEntry(
        name="mlp",
        summary="Fully connected network on the flattened features.",
        params=MLPParams,
        tasks=frozenset({"classification", "regression"}),
        check_shape=_numeric_features,
        size=_mlp_size,
        blocks=_mlp_blocks,
    ),
)
