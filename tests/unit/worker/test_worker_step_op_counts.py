"""The parts of a DP step that touch every parameter tensor run as a few whole-model operations,
not a few per tensor: on a GPU each dispatched operation is at least one kernel launch paid by the
host, and a small model's step is bound by those launches (wrn 16-4 has 60 parameter tensors).

Counted on the CPU with a dispatch mode that sees every aten operation (views, which launch
nothing, are left out), so the test needs no GPU. Before the change the noise cost 3 operations
per tensor, DiceSGD's ψ(e) and e update about 14 per tensor, the released weights' average 2.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip
from dp.loop.batch_loop import BatchAggregator
from dp.per_example.ghost import GhostClipAggregator, ghost_clipped_grad_sum
from dp.per_example.per_sample import AbadiClip
from dp.randomness.noise import privatise_sum
from dp.randomness.secure_random import SecureRandom
from training.ema import ParameterAverage


class ComputeOps(TorchDispatchMode):
    """Counts the aten operations that compute (every operation but views)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if not func.is_view:
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _count(call: Callable[[], object]) -> ComputeOps:
    with ComputeOps() as ops:
        call()
    return ops


@pytest.mark.parametrize("secure", [False, True])
def test_the_noise_of_a_step_costs_the_same_operations_for_3_or_30_tensors(secure: bool) -> None:
    def noise_ops(tensors: int) -> ComputeOps:
        grads = {f"layer{i}.weight": torch.randn(4, 5) for i in range(tensors)}
        generator = SecureRandom.from_seed(1, secure_gaussian=secure)
        return _count(lambda: privatise_sum(grads, noise_std=1.0, normaliser=8.0, generator=generator))

    few, many = noise_ops(3), noise_ops(30)
    assert many.total == few.total, (few.counts, many.counts)
    assert many.total <= 5, many.counts  # the draw's cast, one concatenation, one add, one division


def _mlp(hidden_layers: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(hidden_layers):
        layers += [nn.Linear(6, 6), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(6, 3))


def _step_ops(aggregator: BatchAggregator, hidden_layers: int) -> int:
    model = _mlp(hidden_layers)
    X, y = torch.randn(20, 6), torch.randint(0, 3, (20,))

    def step(index: int) -> None:
        aggregator.clipped_sum(
            model,
            X,
            y,
            step=index,
            loss="cross_entropy",
            max_physical_batch_size=64,
            generator=SecureRandom.from_seed(0),
        )

    step(0)  # DiceSGD creates e at its first step
    return _count(lambda: step(1)).total


def _dicesgd() -> ErrorFeedbackAggregator:
    return ErrorFeedbackAggregator(
        per_sample_map=AbadiClip(1.0), feedback_map=ErrorFeedbackClip(0.5), expected_batch_size=20.0
    )


def test_dicesgd_adds_the_residual_sum_per_layer_and_a_fixed_number_of_operations_besides() -> None:
    """DiceSGD − DP-SGD: the residual's weighted sum per layer (inherent: one more product per
    layer) plus ψ(e) and the e update on the flat e, whose cost does not depend on the depth."""

    def extra(hidden_layers: int) -> int:
        return _step_ops(_dicesgd(), hidden_layers) - _step_ops(GhostClipAggregator(AbadiClip(1.0)), hidden_layers)

    shallow, deep = extra(2), extra(8)
    added_layers = 6  # two parameter tensors each
    assert deep - shallow <= 3 * added_layers, (shallow, deep)
    assert shallow <= 60, shallow


def test_the_flat_error_state_round_trips_by_parameter_name() -> None:
    model = _mlp(1)
    aggregator = _dicesgd()
    error = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    aggregator.error = error
    assert aggregator.error is not None
    assert list(aggregator.error) == list(error)
    for name, value in error.items():
        assert torch.equal(aggregator.error[name], value)
    saved = aggregator.state_dict()
    restored = _dicesgd()
    restored.load_state_dict(saved, model)
    assert restored.error is not None
    for name, value in error.items():
        assert torch.equal(restored.error[name], value)
    error["0.weight"].zero_()  # the aggregator holds its own copy
    assert not torch.equal(aggregator.error["0.weight"], error["0.weight"])


def test_an_error_state_for_other_parameters_is_refused_at_the_step() -> None:
    aggregator = _dicesgd()
    aggregator.error = {"other.weight": torch.zeros(3, 6)}
    with pytest.raises(ValueError, match="does not match"):
        _step_ops(aggregator, 1)
    model = _mlp(1)  # the same names and sizes, one weight transposed
    transposed = {name: torch.zeros(p.shape[::-1]) for name, p in model.named_parameters()}
    aggregator.error = transposed
    with pytest.raises(ValueError, match="does not match"):
        _step_ops(aggregator, 1)
    with pytest.raises(ValueError, match="does not match"):
        _dicesgd().load_state_dict(transposed, model)


def test_the_parameter_average_advances_in_the_same_operations_for_any_depth() -> None:
    def advance_ops(hidden_layers: int) -> int:
        model = _mlp(hidden_layers)
        average = ParameterAverage(model, decay=0.9)
        return _count(lambda: average.advance_to(1, model)).total

    assert advance_ops(8) == advance_ops(1) <= 2


def test_the_ghost_clipped_sum_costs_a_fixed_number_of_operations_per_dense_layer_and_per_chunk() -> None:
    """The host work of a small model's clipped sum: per Linear + Tanh pair, its forward and
    backward (4), ||a||²·(||δ||² + ...) (8: a and δ cast to float64, whose squares are exact,
    dp/per_example/clip_margin.py) and (s·δ)ᵀa, Σ s·δ (3), plus one for the anchor's graph;
    per chunk, the loss, the norms' float64 upper bound cast to float32 (3), the scales and one
    read deciding whether every row's norm is finite.
    It was 15 per layer and 30 per chunk: a RecordedCall kept an empty tensor made per call and the
    finiteness check took six operations."""

    def clipped_sum_ops(hidden_layers: int) -> int:
        model = _mlp(hidden_layers)
        X, y = torch.randn(20, 6), torch.randint(0, 3, (20,))

        def clipped_sum() -> None:
            ghost_clipped_grad_sum(
                model, X, y, loss="cross_entropy", per_sample_map=AbadiClip(1.0), max_physical_batch_size=64
            )

        clipped_sum()
        return _count(clipped_sum).total

    shallow, deep = clipped_sum_ops(1), clipped_sum_ops(8)
    per_layer = (deep - shallow) / 7
    assert per_layer <= 16, (shallow, deep)
    assert shallow - per_layer <= 30, (shallow, deep)
