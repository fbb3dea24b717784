"""Rebuild a downloaded model with the documented function and score it on a held-out NPZ."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from privtrain_common.model_files import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", type=Path, help="the .safetensors file from GET /v1/jobs/{id}/model")
    parser.add_argument("data", type=Path, help="an NPZ with arrays X and y")
    args = parser.parse_args()
    model, config = load_model(args.model)
    with np.load(args.data, allow_pickle=False) as data:
        X = torch.as_tensor(data["X"], dtype=torch.float32)
        y = data["y"]
    with torch.no_grad():
        output = model(X)
    if config["task"] == "classification":
        accuracy = float((output.argmax(dim=1).numpy() == y).mean())
        print(f"{config['model']['name']}: test accuracy {accuracy:.4f} on {len(y)} held-out rows")
    else:
        mse = float(((output.squeeze(-1).numpy() - y) ** 2).mean())
        print(f"{config['model']['name']}: test MSE {mse:.4f} on {len(y)} held-out rows")


if __name__ == "__main__":
    main()
