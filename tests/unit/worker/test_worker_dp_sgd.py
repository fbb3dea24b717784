"""DP-SGD: the noise really added matches the charged event; sampling, normaliser, hooks, resume."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from scipy import stats
from torch import nn

import dp.loop.batch_loop as dp_sgd_module
from dp.loop.batch_loop import (
    DPSGDConfig,
    TrainingHooks,
    TrainingState,
    train_dp_sgd,
)
from dp.randomness.noise import privatise_sum
from dp.randomness.sampling import poisson_sample
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model
from training.artifacts import load_training_state, save_training_state


def _seeded(seed: int) -> torch.Generator:
    """Test data and model init only (non-private)."""
    return torch.Generator().manual_seed(seed)


def _rng(seed: int) -> SecureRandom:
    """A fixed-seed noise stream: tests only."""
    return SecureRandom.from_seed(seed)


def _config(**overrides: object) -> DPSGDConfig:
    base: dict[str, object] = {
        "steps": 10,
        "sampling_probability": 0.2,
        "noise_multiplier": 1.0,
        "clipping_norm": 1.0,
        "learning_rate": 0.1,
    }
    base.update(overrides)
    return DPSGDConfig(**base)  # type: ignore[arg-type]


def _assert_gaussian(samples: torch.Tensor, std: float) -> None:
    """Pooled per-coordinate std within ±3% of `std` (χ² two-sided), mean ≈ 0."""
    z = samples.double().flatten() / std
    n = z.numel()
    assert n >= 10_000  # enough that ±3% is over 4 standard errors
    assert abs(float(z.std()) - 1.0) < 0.03
    cdf = stats.chi2.cdf(float(z.pow(2).sum()), df=n)
    assert 1e-4 < cdf < 1 - 1e-4, cdf
    assert abs(float(z.mean())) < 4.0 / math.sqrt(n)


# ----------------------------------------------------------------------------- noise conformance


def test_privatise_sum_adds_one_gaussian_of_std_sigma_c_over_expected_batch() -> None:
    """Privatisation fed known gradient sums: recover the noise and test its law."""
    sigma, clip, n, q = 1.7, 0.4, 500, 0.04
    normaliser = q * n
    gen = _rng(3)
    known = {"w": torch.randn(3, 4, generator=_seeded(3)), "b": torch.randn(5, generator=_seeded(4))}
    recovered: dict[str, list[torch.Tensor]] = {"w": [], "b": []}
    for _ in range(1000):
        out = privatise_sum(known, noise_std=sigma * clip, normaliser=normaliser, generator=gen)
        for name in known:
            # The released value minus the known part, seen on the update's scale.
            recovered[name].append(out[name] - known[name] / normaliser)
    noise = {name: torch.stack(v) for name, v in recovered.items()}  # (steps, *shape)
    flat = torch.cat([noise["w"].flatten(1), noise["b"].flatten(1)], dim=1)  # (1000, 17)
    _assert_gaussian(flat, sigma * clip / normaliser)
    # Independent across coordinates (no reused draw between tensors) and across steps.
    corr = torch.corrcoef(flat.T.double())
    off_diagonal = corr - torch.eye(17, dtype=torch.float64)
    assert float(off_diagonal.abs().max()) < 0.15
    lag = torch.corrcoef(torch.stack([flat[:-1].flatten(), flat[1:].flatten()]).double())[0, 1]
    assert abs(float(lag)) < 0.03


def _zero_gradient_problem(n: int, d: int, k: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Logistic regression without bias on all-zero inputs: every gradient is exactly 0."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, k, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.randn(k, d, generator=_seeded(5)))
    X = torch.zeros(n, d)
    y = torch.randint(0, k, (n,), generator=_seeded(6))
    return model, X, y


def test_end_to_end_noise_equals_the_charged_gaussian() -> None:
    """Through train_dp_sgd: with zero gradients and lr=1, Δθ_t = −noise_t/(q·n)."""
    n, d, k, steps = 200, 10, 6, 200
    sigma, clip, q = 1.3, 0.7, 0.1
    model, X, y = _zero_gradient_problem(n, d, k)
    snapshots = [model[1].weight.detach().clone()]
    hooks = TrainingHooks(on_step_end=lambda _: snapshots.append(model[1].weight.detach().clone()))
    config = _config(
        steps=steps,
        sampling_probability=q,
        noise_multiplier=sigma,
        clipping_norm=clip,
        learning_rate=1.0,
        max_physical_batch_size=16,
    )
    result = train_dp_sgd(model, X, y, config=config, generator=_rng(99), hooks=hooks)
    assert result.steps_run == steps and not result.stopped_early

    updates = torch.diff(torch.stack(snapshots).double(), dim=0)  # (steps, k, d)
    noise_on_update = -updates
    _assert_gaussian(noise_on_update, sigma * clip / (q * n))

    # The exact stream: per step one Poisson draw (n float64 uniforms), then ONE N(0, σ²C²)
    # draw per parameter element — no second draw, no per-sample noise.
    replay = _rng(99)
    expected = []
    for _ in range(steps):
        replay.uniform(n, dtype=torch.float64)
        expected.append(replay.normal((k, d), std=sigma * clip, dtype=torch.float32) / (q * n))
    torch.testing.assert_close(noise_on_update, torch.stack(expected).double(), rtol=0, atol=2e-5)


# ----------------------------------------------------------------------------- sampling


def test_poisson_batch_sizes_have_binomial_mean_and_variance() -> None:
    n, q, reps = 1000, 0.1, 2000
    gen = _rng(11)
    counts = torch.zeros(n)
    sizes = []
    for _ in range(reps):
        batch = poisson_sample(n, sampling_probability=q, generator=gen)
        assert batch.dtype == torch.int64
        assert bool((batch[1:] > batch[:-1]).all())  # sorted, no duplicates
        assert batch.numel() == 0 or (int(batch.min()) >= 0 and int(batch.max()) < n)
        counts[batch] += 1
        sizes.append(batch.numel())
    size_t = torch.tensor(sizes, dtype=torch.float64)
    mean, var = q * n, q * n * (1 - q)
    assert abs(float(size_t.mean()) - mean) < 5 * math.sqrt(var / reps)
    assert abs(float(size_t.var()) / var - 1) < 5 * math.sqrt(2 / (reps - 1))
    # Every row is included with probability q (χ² over per-row inclusion counts).
    chi2 = float(((counts - reps * q) ** 2).sum()) / (reps * q * (1 - q))
    assert 1e-4 < stats.chi2.cdf(chi2, df=n - 1) < 1 - 1e-4


def test_poisson_sampling_rejects_invalid_rates() -> None:
    for q in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            poisson_sample(10, sampling_probability=q, generator=_rng(0))


def test_empty_batches_still_take_a_noisy_step(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes: list[int] = []

    def spy(n: int, *, sampling_probability: float, generator: SecureRandom) -> torch.Tensor:
        batch = poisson_sample(n, sampling_probability=sampling_probability, generator=generator)
        sizes.append(batch.numel())
        return batch

    monkeypatch.setattr(dp_sgd_module, "poisson_sample", spy)
    model = build_model("logistic-regression", {}, input_shape=(3,), n_outputs=2, generator=_seeded(0))
    X = torch.randn(20, 3, generator=_seeded(1))
    y = torch.randint(0, 2, (20,), generator=_seeded(2))
    weights = [model[1].weight.detach().clone()]
    done: list[int] = []

    def on_step_end(step: int) -> None:
        done.append(step)
        weights.append(model[1].weight.detach().clone())

    config = _config(steps=30, sampling_probability=0.02)
    result = train_dp_sgd(model, X, y, config=config, generator=_rng(3), hooks=TrainingHooks(on_step_end=on_step_end))
    assert result.steps_run == 30 and done == list(range(1, 31))
    empty_steps = [i for i, size in enumerate(sizes) if size == 0]
    assert len(empty_steps) >= 5
    for i in empty_steps:
        assert not torch.equal(weights[i + 1], weights[i])  # noise was added and applied


# ----------------------------------------------------------------------------- normaliser


def test_update_is_divided_by_the_expected_not_the_realised_batch_size() -> None:
    n, q, lr, clip, seed = 10, 0.5, 0.3, 1.5, 27
    gen = _seeded(7)
    X = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(n, generator=gen, dtype=torch.float64)
    w0 = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)
    model = nn.Sequential(nn.Linear(3, 1, bias=False)).double()
    with torch.no_grad():
        model[0].weight.copy_(w0)

    replay = _rng(seed)
    in_batch = replay.uniform(n, dtype=torch.float64) < q
    assert int(in_batch.sum()) != q * n  # otherwise the test could not tell them apart
    # mse per-sample gradient of (w·x − y)² is 2(w·x − y)·x.
    residual = X @ w0[0] - y
    grads = 2 * residual[:, None] * X
    norms = grads.norm(dim=1)
    assert bool((norms > clip).any()) and bool((norms <= clip).any())
    clipped = grads * torch.clamp(clip / norms, max=1.0)[:, None]
    expected = w0 - lr * clipped[in_batch].sum(dim=0, keepdim=True) / (q * n)

    config = _config(
        steps=1, sampling_probability=q, noise_multiplier=0.0, clipping_norm=clip, learning_rate=lr, loss="mse"
    )
    train_dp_sgd(model, X, y, config=config, generator=_rng(seed))
    torch.testing.assert_close(model[0].weight.detach(), expected, rtol=1e-12, atol=1e-12)


def test_chunk_size_does_not_change_training() -> None:
    def run(chunk: int) -> torch.Tensor:
        model = build_model("mlp", {"hidden_sizes": [5]}, input_shape=(4,), n_outputs=3, generator=_seeded(0)).double()
        X = torch.randn(50, 4, generator=_seeded(1), dtype=torch.float64)
        y = torch.randint(0, 3, (50,), generator=_seeded(2))
        config = _config(steps=5, sampling_probability=0.5, max_physical_batch_size=chunk)
        train_dp_sgd(model, X, y, config=config, generator=_rng(3))
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    torch.testing.assert_close(run(1), run(256), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- cancel and resume


def _mlp_problem(init_seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    model = build_model("mlp", {"hidden_sizes": [8]}, input_shape=(5,), n_outputs=3, generator=_seeded(init_seed))
    X = torch.randn(60, 5, generator=_seeded(100))
    y = torch.randint(0, 3, (60,), generator=_seeded(101))
    return model, X, y


RESUME_CONFIG = _config(
    steps=12,
    sampling_probability=0.2,
    noise_multiplier=1.1,
    clipping_norm=0.5,
    learning_rate=0.2,
    momentum=0.9,
    weight_decay=1e-3,
    max_physical_batch_size=4,
)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_should_stop_cancels_before_the_next_step() -> None:
    model, X, y = _mlp_problem()
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    done: list[int] = []
    result = train_dp_sgd(
        model,
        X,
        y,
        config=RESUME_CONFIG,
        generator=_rng(42),
        hooks=TrainingHooks(should_stop=should_stop, on_step_end=done.append),
    )
    assert result.steps_run == 3 and result.stopped_early
    assert done == [1, 2, 3]

    reference, _, _ = _mlp_problem()
    three_steps = dataclasses.replace(RESUME_CONFIG, steps=3)
    train_dp_sgd(reference, X, y, config=three_steps, generator=_rng(42))
    for a, b in zip(_params(model), _params(reference), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("via_file", [False, True], ids=["in-memory", "safetensors-file"])
def test_checkpoint_and_resume_is_bit_identical(via_file: bool, tmp_path: Path) -> None:
    reference, X, y = _mlp_problem()
    train_dp_sgd(reference, X, y, config=RESUME_CONFIG, generator=_rng(42))

    checkpoints: list[TrainingState] = []

    def save(state: TrainingState) -> None:
        if via_file:
            path = tmp_path / f"ckpt-{state.step}.safetensors"
            save_training_state(path, state)
            checkpoints.append(load_training_state(path))
        else:
            checkpoints.append(state)

    # Runs 7 steps, checkpoints after step 5, then "crashes": steps 6-7 are lost and redone.
    interrupted, _, _ = _mlp_problem()
    steps_done: list[int] = []
    result = train_dp_sgd(
        interrupted,
        X,
        y,
        config=RESUME_CONFIG,
        generator=_rng(42),
        hooks=TrainingHooks(
            save_checkpoint=save,
            checkpoint_every=5,
            on_step_end=steps_done.append,
            should_stop=lambda: len(steps_done) == 7,
        ),
    )
    assert result.steps_run == 7 and result.stopped_early
    assert [c.step for c in checkpoints] == [5]

    # A retry: a fresh process with a different init and a different seed; state is restored.
    resumed, _, _ = _mlp_problem(init_seed=9)
    done: list[int] = []
    result = train_dp_sgd(
        resumed,
        X,
        y,
        config=RESUME_CONFIG,
        generator=_rng(12345),
        resume_from=checkpoints[0],
        hooks=TrainingHooks(on_step_end=done.append),
    )
    assert result.steps_run == RESUME_CONFIG.steps and not result.stopped_early
    assert done == list(range(6, 13))
    for a, b in zip(_params(resumed), _params(reference), strict=True):
        assert torch.equal(a, b)


def test_resume_at_the_end_runs_no_more_steps_and_bad_steps_are_refused() -> None:
    model, X, y = _mlp_problem()
    states: list[TrainingState] = []
    train_dp_sgd(
        model,
        X,
        y,
        config=RESUME_CONFIG,
        generator=_rng(1),
        hooks=TrainingHooks(save_checkpoint=states.append, checkpoint_every=4),
    )
    assert [s.step for s in states] == [4, 8, 12]
    before = _params(model)
    result = train_dp_sgd(model, X, y, config=RESUME_CONFIG, generator=_rng(1), resume_from=states[-1])
    assert result.steps_run == 12 and not result.stopped_early
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model), strict=True))
    with pytest.raises(ValueError, match="cannot resume"):
        train_dp_sgd(model, X, y, config=_config(steps=3), generator=_rng(1), resume_from=states[0])


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "overrides",
    [
        {"steps": -1},
        {"steps": 2.0},
        {"sampling_probability": 0.0},
        {"sampling_probability": 1.01},
        {"sampling_probability": float("nan")},
        {"noise_multiplier": -0.1},
        {"noise_multiplier": float("inf")},
        {"clipping_norm": 0.0},
        {"learning_rate": 0.0},
        {"momentum": 1.0},
        {"weight_decay": -1e-3},
        {"loss": "hinge"},
        {"max_physical_batch_size": 0},
    ],
)
def test_invalid_config_is_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _config(**overrides)


def test_batchnorm_and_mismatched_data_are_refused() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    X, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(ValueError, match="BatchNorm"):
        train_dp_sgd(model, X, y, config=_config(), generator=_rng(0))
    good = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="rows"):
        train_dp_sgd(good, X, y[:5], config=_config(), generator=_rng(0))


def test_secure_generators_are_independently_seeded() -> None:
    a = SecureRandom.from_os_entropy("cpu", secure_gaussian=True)
    b = SecureRandom.from_os_entropy(torch.device("cpu"), secure_gaussian=True)
    assert a.device == torch.device("cpu")
    assert not torch.equal(a.uniform(8), b.uniform(8))


def test_a_torch_generator_is_refused_for_noise() -> None:
    model = nn.Sequential(nn.Linear(3, 2))
    X, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(TypeError, match="SecureRandom"):
        train_dp_sgd(model, X, y, config=_config(), generator=torch.Generator().manual_seed(0))
