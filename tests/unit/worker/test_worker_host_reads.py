"""A DP step reads back from the device only what it must: each read (float(t), bool(t), t.item(),
...) makes the host wait until the device has finished everything queued, which leaves a GPU idle.

Counted on the CPU with a torch function mode that sees every such call, so the test needs no
GPU and fails as soon as a per-parameter or per-row read creeps back into a step (DiceSGD read
two norms per parameter tensor per step before it kept them on the device).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from algorithms.dc_dpsgd.aggregators import RankAggregator, ThresholdAggregator, ThresholdTracker
from algorithms.dc_dpsgd.projection import StreamingProjection
from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip, ErrorFeedbackNormalise
from dp.loop.batch_loop import BatchAggregator, DPSGDConfig, train_dp_sgd
from dp.per_example.ghost import GhostClipAggregator
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model

HOST_READS = frozenset({"__float__", "__bool__", "__int__", "__index__", "item", "tolist", "numpy", "cpu"})


class HostReads(TorchFunctionMode):
    """Counts the calls that copy a tensor's value to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def _projection() -> StreamingProjection:
    return StreamingProjection(k=5)


# name -> (aggregator factory, host reads allowed per step of one chunk, and why)
AGGREGATORS: dict[str, tuple[Callable[[], BatchAggregator], int]] = {
    # the all-rows-finite check of the clipped sum
    "dp-sgd": (lambda: GhostClipAggregator(AbadiClip(1.0)), 1),
    # the same check; ψ(e), its norm and the overflow guard stay on the device
    "dicesgd-clip": (
        lambda: ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(1.0), feedback_map=ErrorFeedbackClip(0.5), expected_batch_size=20.0
        ),
        1,
    ),
    "dicesgd-normalise": (
        lambda: ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(1.0), feedback_map=ErrorFeedbackNormalise(0.1), expected_batch_size=20.0
        ),
        1,
    ),
    # the Cholesky factor's status (a rank-deficient W falls back) and the finite check
    "dc-dpsgd": (lambda: RankAggregator(c1=1.0, c2=0.1, projection=_projection(), p=0.2), 2),
    # ... and the tail count and its noise, which set the next threshold on the host
    "dc-dpsgd-threshold": (
        lambda: ThresholdAggregator(
            c1=1.0,
            c2=0.1,
            projection=_projection(),
            tracker=ThresholdTracker(target_fraction=0.2, eta=0.2, count_noise_std=1.0, expected_batch_size=20.0),
        ),
        4,
    ),
}


@pytest.mark.parametrize("name", list(AGGREGATORS))
def test_a_step_reads_back_only_what_it_must(name: str) -> None:
    make, per_step = AGGREGATORS[name]
    model = build_model(
        "cnn",
        {"channels": [4, 8], "groups": 2},
        input_shape=(3, 8, 8),
        n_outputs=3,
        generator=torch.Generator().manual_seed(0),
    )
    X = torch.randn(200, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (200,), generator=torch.Generator().manual_seed(2))
    steps = 6
    config = DPSGDConfig(
        steps=steps,
        sampling_probability=0.1,
        noise_multiplier=1.0,
        clipping_norm=1.0,
        learning_rate=0.1,
        max_physical_batch_size=200,  # one chunk per step
    )
    before = [p.detach().clone() for p in model.parameters()]
    with HostReads() as reads:
        train_dp_sgd(model, X, y, config=config, generator=SecureRandom.from_seed(1), aggregator=make())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))  # it trained
    assert sum(reads.counts.values()) <= per_step * steps, dict(reads.counts)


def test_the_counter_sees_every_kind_of_read() -> None:
    """The control: each way of reading a value back is counted."""
    t = torch.tensor([1.5])
    with HostReads() as reads:
        float(t), bool(t), int(t), t.item(), t.tolist(), t.cpu()
    assert sum(reads.counts.values()) == 6
