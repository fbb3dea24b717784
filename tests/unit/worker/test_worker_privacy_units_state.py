"""DC-DPSGD, DiceSGD and the KL family per privacy unit: their name-keyed state (the projection scope, the error
feedback) sees the model's own parameter names through the per-unit wrapper; one unit with
hundreds of rows moves what a step releases by at most the charged sensitivity (measured); and a
per-unit DiceSGD run resumes from its checkpoint bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from algorithms.dc_dpsgd.aggregators import RankAggregator, ThresholdAggregator
from algorithms.dc_dpsgd.projection import StreamingProjection
from algorithms.dicesgd.aggregator import ErrorFeedbackAggregator, ErrorFeedbackClip, train_dicesgd
from algorithms.kl_family.common import FullBatch, flat_params
from dp.data.units import UnitIndex
from dp.loop.augmult import AugmentedViews
from dp.loop.batch_loop import BatchAggregator, DPSGDConfig, UnitSampling
from dp.loop.state import TrainingHooks, TrainingState
from dp.loop.units import PerUnitAggregator
from dp.per_example.per_sample import AbadiClip
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_training_state, save_training_state

ROWS_PER_UNIT = 4


def _model() -> nn.Module:
    return build_model(
        "mlp", {"hidden_sizes": [8]}, input_shape=(6,), n_outputs=3, generator=torch.Generator().manual_seed(1)
    )


def _batches() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ten light units of 4 row slots, and one heavy unit: 4 slots drawn from its 300 large,
    aligned rows (their gradients sum to far more than any bound)."""
    torch.manual_seed(0)
    light, y_light = torch.randn(10, ROWS_PER_UNIT, 6), torch.randint(0, 3, (10, ROWS_PER_UNIT))
    heavy_rows = 50.0 * torch.ones(300, 6)
    heavy = heavy_rows[torch.randperm(300)[:ROWS_PER_UNIT]][None]
    return light, y_light, heavy, torch.zeros(1, ROWS_PER_UNIT, dtype=torch.int64)


def _released(aggregator: BatchAggregator, model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    sums = aggregator.clipped_sum(
        model, X, y, step=0, loss="cross_entropy", max_physical_batch_size=8, generator=SecureRandom.from_seed(0)
    )
    assert list(sums) == [name for name, p in model.named_parameters() if p.requires_grad]  # the model's names
    return torch.cat([s.flatten() for s in sums.values()])


def test_the_per_unit_wrapper_keeps_the_models_parameter_names() -> None:
    model = _model()
    wrapped = AugmentedViews(model)
    assert [name for name, _ in wrapped.named_parameters()] == [name for name, _ in model.named_parameters()]
    X = torch.randn(5, ROWS_PER_UNIT, 6)
    torch.testing.assert_close(wrapped(X)[:, 2], model(X[:, 2]))
    with pytest.raises(ValueError, match="at its root"):
        AugmentedViews(nn.Linear(6, 3))  # a root that owns parameters could not be shared by name


@pytest.mark.parametrize("rule", ["rank", "threshold"])
def test_a_heavy_unit_moves_dc_dpsgds_sum_by_at_most_its_sensitivity(rule: str) -> None:
    """The projection's scope names one layer by the model's own name; the released sum moves by
    at most 2·c1 − c2 (rank) or c1 (threshold) when the heavy unit joins the batch."""
    model = _model()
    projection = StreamingProjection(k=3, scope=("1.weight",))
    inner: RankAggregator | ThresholdAggregator = (
        RankAggregator(c1=1.0, c2=0.25, projection=projection, p=0.2)
        if rule == "rank"
        else ThresholdAggregator(c1=1.0, c2=0.25, projection=projection, tau=1e-9)  # every unit is tail
    )
    aggregator = PerUnitAggregator(inner, rows_per_unit=ROWS_PER_UNIT)
    light, y_light, heavy, y_heavy = _batches()
    moved = float(
        (
            _released(aggregator, model, torch.cat([light, heavy]), torch.cat([y_light, y_heavy]))
            - _released(aggregator, model, light, y_light)
        ).norm()
    )
    assert 0.0 < moved <= inner.sensitivity * (1 + 1e-5)


def test_a_heavy_unit_moves_dicesgds_releases_by_at_most_its_sensitivity() -> None:
    """Step 1 releases the clipped sum (the unit moves it by ≤ C1); what clipping removed from the
    unit's gradient enters the hidden error e, which moves step 2's release (the same batch
    without it) by ≤ 2·B·C2 only: Δ_sum = C1 + 2·B·C2 bounds both."""
    c1, c2, batch = 0.5, 0.05, 10.0
    light, y_light, heavy, y_heavy = _batches()
    released: list[list[torch.Tensor]] = []
    for with_heavy in (False, True):
        model = _model()
        inner = ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(c1), feedback_map=ErrorFeedbackClip(c2), expected_batch_size=batch
        )
        aggregator = PerUnitAggregator(inner, rows_per_unit=ROWS_PER_UNIT)
        first = (torch.cat([light, heavy]), torch.cat([y_light, y_heavy])) if with_heavy else (light, y_light)
        released.append([_released(aggregator, model, *first), _released(aggregator, model, light, y_light)])
        assert inner.error is not None and list(inner.error) == [name for name, _ in model.named_parameters()]
        inner.load_state_dict(inner.state_dict(), model)  # a checkpoint of e matches the model
    step_one = float((released[1][0] - released[0][0]).norm())
    step_two = float((released[1][1] - released[0][1]).norm())
    assert 0.9 * c1 < step_one <= c1 * (1 + 1e-5)
    assert 0.0 < step_two <= 2 * batch * c2 * (1 + 1e-5)
    assert inner.sensitivity == pytest.approx(c1 + 2 * batch * c2)


def test_a_per_unit_dicesgd_run_resumes_bit_for_bit(tmp_path: Path) -> None:
    torch.manual_seed(5)
    codes = np.random.default_rng(0).permutation(np.repeat(np.arange(20), [1, 2, 3, 9] * 5))
    X, y = torch.randn(codes.size, 6) * 5, torch.randint(0, 3, (codes.size,))
    units = UnitIndex.from_codes(codes)
    config = DPSGDConfig(
        steps=9,
        sampling_probability=0.3,
        noise_multiplier=0.8,
        clipping_norm=1.0,
        learning_rate=0.2,
        expected_batch_size=6.0,
    )

    def run(**kwargs: object) -> nn.Module:
        model = _model()
        aggregator = ErrorFeedbackAggregator(
            per_sample_map=AbadiClip(0.2), feedback_map=ErrorFeedbackClip(0.3), expected_batch_size=6.0
        )
        train_dicesgd(
            model,
            X,
            y,
            config=config,
            aggregator=aggregator,
            generator=SecureRandom.from_seed(7),
            units=units,
            rows_per_unit=3,
            **kwargs,  # type: ignore[arg-type]
        )
        return model

    straight = run()
    path = tmp_path / "ckpt.safetensors"

    def save(state: TrainingState) -> None:
        save_training_state(path, state)

    run(hooks=TrainingHooks(save_checkpoint=save, checkpoint_every=4))
    resumed = run(resume_from=load_training_state(path))
    for a, b in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("release", ["gradient", "difference"])
def test_a_heavy_unit_moves_a_kl_full_batch_sum_by_at_most_its_clip(release: str) -> None:
    """The KL family's full-batch sums per unit: every unit's mean gradient over its row slots is
    one clipped term, so the heavy unit (300 large rows) moves the clipped gradient sum by at most
    L0 and the clipped difference sum by at most C. Light units have one row each, so their slots
    do not depend on the draw and the two datasets differ by the heavy unit only."""
    lipschitz, clip = 0.7, 0.2
    torch.manual_seed(3)
    light_X, light_y = torch.randn(12, 6), torch.randint(0, 3, (12,))
    heavy_X, heavy_y = 50.0 * torch.ones(300, 6) + torch.randn(300, 6), torch.zeros(300, dtype=torch.int64)

    def total(with_heavy: bool) -> torch.Tensor:
        model = _model()
        X = torch.cat([light_X, heavy_X]) if with_heavy else light_X
        y = torch.cat([light_y, heavy_y]) if with_heavy else light_y
        codes = np.concatenate([np.arange(12), np.full(300 if with_heavy else 0, 12)])
        data = FullBatch(
            X=X,
            y=y,
            loss="cross_entropy",
            lipschitz=lipschitz,
            normaliser=12.0,
            max_physical_batch_size=8,
            generator=SecureRandom.from_seed(0),
            noise_safety=1.0,
            units_for=lambda share: 0,
            units=UnitSampling(index=UnitIndex.from_codes(codes), rows_per_unit=ROWS_PER_UNIT),
        )
        if release == "gradient":
            sums = data.clipped_sum(model)
        else:
            old_point = flat_params(model) + 0.5 * torch.randn(
                flat_params(model).numel(), generator=torch.Generator().manual_seed(4)
            )
            sums = data.clipped_difference_sum(model, old_point, clip=clip)
        assert list(sums) == [name for name, _ in model.named_parameters()]
        return torch.cat([s.flatten() for s in sums.values()])

    moved = float((total(True) - total(False)).norm())
    bound = lipschitz if release == "gradient" else clip
    assert 0.5 * bound < moved <= bound * (1 + 1e-5)
