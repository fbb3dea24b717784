"""Training per privacy unit: the row slots a step draws, the bound on one unit's contribution
(measured, for a unit with hundreds of rows), and the noise the trainer draws against the charge."""

from __future__ import annotations

import math
from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.data.units import UnitIndex
from dp.loop.batch_loop import PerSampleMapAggregator, per_sample_map_aggregator
from dp.loop.state import TrainingHooks
from dp.loop.units import PerUnitAggregator
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from kernel import privacy
from kernel.db.orm import Dataset
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import build_model


def _codes(counts: list[int]) -> np.ndarray:
    """Unit codes for rows in shuffled order: unit u has counts[u] rows."""
    codes = np.repeat(np.arange(len(counts)), counts)
    return np.random.default_rng(0).permutation(codes)


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=20),
    k=st.integers(min_value=1, max_value=8),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_slots_come_from_the_unit_distinct_when_it_has_enough_and_evenly_repeated_otherwise(
    counts: list[int], k: int, seed: int
) -> None:
    codes = _codes(counts)
    index = UnitIndex.from_codes(codes)
    assert index.n_units == len(counts)
    units = torch.arange(len(counts))
    slots = index.slots(units, rows_per_unit=k, generator=SecureRandom.from_seed(seed))
    assert slots.shape == (len(counts), k)
    for u, m in enumerate(counts):
        rows = slots[u].tolist()
        assert all(codes[r] == u for r in rows)  # only the unit's own rows
        uses = np.bincount(rows, minlength=len(codes))[np.flatnonzero(codes == u)]
        if m >= k:
            assert sorted(set(rows)) == sorted(rows)  # k distinct rows
        else:
            assert uses.min() >= k // m and uses.max() <= -(-k // m)  # every row, evenly repeated


def test_slots_draw_each_row_uniformly() -> None:
    index = UnitIndex.from_codes(np.zeros(5, dtype=np.int64))  # one unit of 5 rows
    generator = SecureRandom.from_seed(3)
    seen = np.zeros(5)
    for _ in range(2000):
        seen[index.slots(torch.tensor([0]), rows_per_unit=2, generator=generator)[0].numpy()] += 1
    assert stats.chisquare(seen).pvalue > 1e-3


def test_row_weights_sum_to_one_per_unit() -> None:
    codes = _codes([1, 4, 300])
    weights = UnitIndex.from_codes(codes).row_weights(codes.size)
    for u in range(3):
        assert float(weights[torch.from_numpy(codes == u)].sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_a_unit_with_hundreds_of_rows_moves_the_sum_by_at_most_the_clipping_norm(engine: str) -> None:
    """Measured: the clipped sum with and without one heavy unit (300 rows with large, aligned
    gradients) differs by at most C, although its rows' gradients add up to far more."""
    clip = 0.5
    torch.manual_seed(0)
    model = build_model(
        "mlp", {"hidden_sizes": [8]}, input_shape=(6,), n_outputs=3, generator=torch.Generator().manual_seed(1)
    )
    inner = (
        per_sample_map_aggregator(model, AbadiClip(clip))
        if engine == "ghost"
        else PerSampleMapAggregator(AbadiClip(clip))
    )
    aggregator = PerUnitAggregator(inner, rows_per_unit=4)
    light = torch.randn(10, 4, 6)
    heavy_rows = 50.0 * torch.ones(300, 6)
    heavy = heavy_rows[torch.randperm(300)[:4]][None]
    y_light, y_heavy = torch.randint(0, 3, (10, 4)), torch.zeros(1, 4, dtype=torch.int64)

    def total(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sums = aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=8, generator=SecureRandom.from_seed(0)
        )
        return torch.cat([s.flatten() for s in sums.values()])

    without = total(light, y_light)
    with_heavy = total(torch.cat([light, heavy]), torch.cat([y_light, y_heavy]))
    moved = float((with_heavy - without).norm())
    assert 0.9 * clip < moved <= clip * (1 + 1e-5)


@pytest.mark.parametrize("engine", ["ghost", "vmap"])
def test_a_users_messages_move_a_transformers_sum_by_at_most_the_clipping_norm(engine: str) -> None:
    """The same bound on a text classifier (embeddings, attention, layer norms): the ghost engine
    sees each layer k times per unit and must add the k calls up per unit."""
    clip = 0.3
    torch.manual_seed(0)
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 50, "pad_id": 0, "pooling": "first"}
    model = build_model(
        "transformer-classifier", params, input_shape=(12,), n_outputs=2, generator=torch.Generator().manual_seed(1)
    )
    inner = (
        per_sample_map_aggregator(model, AbadiClip(clip))
        if engine == "ghost"
        else PerSampleMapAggregator(AbadiClip(clip))
    )
    aggregator = PerUnitAggregator(inner, rows_per_unit=3)
    light = torch.randint(1, 50, (6, 3, 12))
    heavy = torch.randint(1, 50, (1, 3, 12))
    y_light, y_heavy = torch.randint(0, 2, (6, 3)), torch.ones(1, 3, dtype=torch.int64)

    def total(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        sums = aggregator.clipped_sum(
            model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=8, generator=SecureRandom.from_seed(0)
        )
        return torch.cat([s.flatten() for s in sums.values()])

    moved = float((total(torch.cat([light, heavy]), torch.cat([y_light, y_heavy])) - total(light, y_light)).norm())
    assert 0.0 < moved <= clip * (1 + 1e-4)


def test_the_per_unit_trainer_draws_the_charged_noise() -> None:
    """Plan a dp-sgd job on a dataset of 600 persons with 4,000 rows (q over persons), run the
    trainer per unit on rows whose weight gradients are zero, and recover the noise."""
    n_rows, n_units, n_features, batch = 4000, 600, 1200, 60
    dataset = Dataset(
        n_rows=n_rows,
        n_units=n_units,
        privacy_unit_column="person",
        feature_shape=[n_features],
        task="classification",
        n_classes=2,
    )
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 0.7}},
            "privacy": {"target_epsilon": 2.0},
            "training": {"steps": 15, "batch_size": batch, "learning_rate": 0.5, "rows_per_unit": 3},
        }
    )
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000)
    event = privacy.event_from_json(plan.event_json)
    assert isinstance(event, privacy.PoissonSampledGaussianEvent)
    assert event.sampling_probability == pytest.approx(batch / n_units)  # over persons, not rows
    model = build_model(
        "logistic-regression", {}, input_shape=(n_features,), n_outputs=2, generator=torch.Generator().manual_seed(0)
    )
    before = model[-1].weight.detach().clone()
    sizes = [n_rows // n_units + (u < n_rows % n_units) for u in range(n_units)]
    original = PerUnitAggregator.clipped_sum
    with mock.patch.object(PerUnitAggregator, "clipped_sum", autospec=True, side_effect=original) as spy:
        result = get_trainer("dp-sgd")(
            TrainingRequest(
                model=model,
                features=TensorRows(torch.zeros(n_rows, n_features)),
                y=torch.randint(0, 2, (n_rows,)),
                task="classification",
                hyperparameters=plan.hyperparameters,
                training=plan.training,
                noise_multiplier=plan.noise_multiplier,
                sampling_probability=plan.plan.sampling_probability,
                expected_batch_size=plan.plan.expected_batch_size,
                steps=plan.plan.steps,
                max_physical_batch_size=64,
                generator=SecureRandom.from_seed(1),
                hooks=TrainingHooks(),
                resume_from=None,
                device=torch.device("cpu"),
                units=UnitIndex.from_codes(_codes(sizes)),
            )
        )
    calls = [tuple(call.args[2].shape) for call in spy.call_args_list]
    assert result.steps_run == 15
    assert len(calls) == 15 and all(shape[1:] == (3, n_features) for shape in calls)
    assert 0.5 * batch < np.mean([shape[0] for shape in calls]) < 1.5 * batch  # ~B units a step
    change = (model[-1].weight.detach() - before).flatten().double().numpy()
    expected_std = 0.5 * math.sqrt(15) * plan.noise_std_on_sum / batch  # lr·√T·σC / B (B in units)
    statistic = float(np.sum((change / expected_std) ** 2))
    p_value = 2 * min(stats.chi2.cdf(statistic, change.size), stats.chi2.sf(statistic, change.size))
    assert p_value > 1e-3


@pytest.mark.parametrize(
    ("name", "params", "shape", "X"),
    [
        ("mlp", {"hidden_sizes": [8]}, (6,), lambda: torch.randn(7, 3, 6)),
        (
            "transformer-classifier",
            {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 16, "vocab_size": 50, "pad_id": 0, "pooling": "first"},
            (12,),
            lambda: torch.randint(1, 50, (7, 3, 12)),
        ),
    ],
)
def test_both_engines_clip_each_units_mean_gradient_alike(
    name: str, params: dict[str, object], shape: tuple[int, ...], X: Callable[[], torch.Tensor]
) -> None:
    """Ghost clipping over k calls per layer gives the vmap engine's per-unit clipped sum."""
    torch.manual_seed(2)
    model = build_model(name, params, input_shape=shape, n_outputs=2, generator=torch.Generator().manual_seed(3))
    batch, y = X(), torch.randint(0, 2, (7, 3))
    assert not isinstance(per_sample_map_aggregator(model, AbadiClip(0.05)), PerSampleMapAggregator)  # ghost
    sums = [
        PerUnitAggregator(inner, rows_per_unit=3).clipped_sum(
            model,
            batch,
            y,
            step=0,
            loss="cross_entropy",
            max_physical_batch_size=4,
            generator=SecureRandom.from_seed(0),
        )
        for inner in (per_sample_map_aggregator(model, AbadiClip(0.05)), PerSampleMapAggregator(AbadiClip(0.05)))
    ]
    assert sums[0].keys() == sums[1].keys()
    for key in sums[0]:
        torch.testing.assert_close(sums[0][key], sums[1][key], rtol=1e-4, atol=1e-6)
