"""A tiny end-to-end check that DP-SGD, as implemented, actually learns."""

from __future__ import annotations

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

from dp.loop.batch_loop import DPSGDConfig, train_dp_sgd
from dp.randomness.secure_random import SecureRandom
from privtrain_common.zoo.architectures import build_model


def test_dp_logistic_regression_learns_digits() -> None:
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    X_train_t = torch.tensor(scaler.transform(X_train), dtype=torch.float32)
    X_test_t = torch.tensor(scaler.transform(X_test), dtype=torch.float32)
    y_train_t, y_test_t = torch.tensor(y_train), torch.tensor(y_test)

    model = build_model(
        "logistic-regression", {}, input_shape=(64,), n_outputs=10, generator=torch.Generator().manual_seed(0)
    )
    config = DPSGDConfig(
        steps=300, sampling_probability=0.05, noise_multiplier=1.0, clipping_norm=1.0, learning_rate=1.0
    )
    result = train_dp_sgd(model, X_train_t, y_train_t, config=config, generator=SecureRandom.from_seed(1))
    assert result.steps_run == 300

    model.eval()
    with torch.no_grad():
        accuracy = (model(X_test_t).argmax(dim=1) == y_test_t).float().mean().item()
    assert accuracy > 0.8, accuracy
