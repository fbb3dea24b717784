"""Every algorithm offered on language-model datasets trains a tiny transformer-lm through its
registered trainer (hand-made token tensor, no upload), and the DP loop takes (n, T) targets."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from algorithms import get_algorithm
from algorithms.trainers import TrainingRequest, get_trainer
from dp.data.rows import TensorRows
from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.loop.state import TrainingHooks
from dp.losses import get_loss
from dp.randomness.secure_random import SecureRandom
from kernel.schemas.jobs import TrainingSpec
from tests.unit.worker.text_fixtures import lm_targets, text_model, tokens

N, BATCH, STEPS = 16, 4, 3

# algorithm -> hyperparameters (small k for DC-DPSGD's projection)
LM_ALGORITHMS: dict[str, dict[str, Any]] = {
    "dp-sgd": {"clipping_norm": 1.0},
    "dp-adam": {"clipping_norm": 1.0},
    "auto-s": {},
    "dp-psac": {},
    "dicesgd": {},
    "dc-dpsgd-threshold": {"k": 4},
    "dc-dpsgd": {"k": 4},
    "sgd": {},
    "adam": {},
}


def _request(name: str, model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor, **training: Any) -> TrainingRequest:
    algorithm = get_algorithm(name)
    spec = TrainingSpec.model_validate({"steps": STEPS, "batch_size": BATCH, "learning_rate": 0.05, **training})
    return TrainingRequest(
        model=model,
        features=TensorRows(X),
        y=y,
        task="language-model",
        hyperparameters=algorithm.validate_hyperparameters(LM_ALGORITHMS[name]),
        training=spec,
        noise_multiplier=0.5 if algorithm.private else 0.0,
        sampling_probability=BATCH / N,
        expected_batch_size=float(BATCH),
        steps=STEPS,
        max_physical_batch_size=3,
        generator=SecureRandom.from_seed(11),
        hooks=TrainingHooks(),
        resume_from=None,
        device=torch.device("cpu"),
    )


@pytest.mark.parametrize("name", list(LM_ALGORITHMS))
def test_algorithm_trains_a_tiny_language_model(name: str) -> None:
    model = text_model("transformer-lm", dtype=torch.float32)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    X = tokens(N)
    result = get_trainer(name)(_request(name, model, X, lm_targets(X)))
    assert result.steps_run == STEPS and not result.stopped_early
    after = model.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert model(X).shape == (N, X.shape[1], 13)


def test_token_loss_sum_is_the_loss_the_trainer_uses() -> None:
    request = _request("dp-sgd", text_model("transformer-lm"), tokens(N), lm_targets(tokens(N)), token_loss="sum")
    assert request.loss == "token_cross_entropy_sum"
    assert _request("dp-sgd", text_model("transformer-lm"), tokens(N), lm_targets(tokens(N))).loss == (
        "token_cross_entropy_mean"
    )


def test_non_private_pretraining_lowers_the_loss() -> None:
    """Public pretraining of a text model: adam on a repeated pattern learns it."""
    model = text_model("transformer-lm", dtype=torch.float32)
    X = torch.tensor([[1, 2, 3, 4, 5, 6]] * N)
    y = lm_targets(X)
    loss = get_loss("token_cross_entropy_mean")
    with torch.no_grad():
        start = float(loss.fn(model(X), y)) / N
    get_trainer("adam")(dataclasses.replace(_request("adam", model, X, y), steps=60))
    with torch.no_grad():
        assert float(loss.fn(model(X), y)) / N < 0.5 * start


def test_dp_sgd_accepts_row_aligned_token_targets_and_refuses_other_shapes() -> None:
    model = text_model("transformer-lm", dtype=torch.float32)
    X = tokens(N)
    config = DPSGDConfig(
        steps=2,
        sampling_probability=0.5,
        noise_multiplier=1.0,
        clipping_norm=1.0,
        learning_rate=0.1,
        loss="token_cross_entropy_mean",
        max_physical_batch_size=4,
    )
    result = train_dp_sgd(model, X, lm_targets(X), config=config, generator=SecureRandom.from_seed(2))
    assert result.steps_run == 2
    with pytest.raises(ValueError, match=r"\(n,\) or \(n, T\)"):
        train_dp_sgd(model, X, lm_targets(X).unsqueeze(-1), config=config, generator=SecureRandom.from_seed(2))
