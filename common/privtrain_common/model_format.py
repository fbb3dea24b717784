"""The model file format's constants, torch-free: the service reads a released file's config
(for the ``format=hf`` download) without torch, and ``model_files`` writes and reads with them."""

from __future__ import annotations

CONFIG_KEY = "privtrain.config"
"""The safetensors metadata key that holds the file's JSON architecture config."""
FORMAT_VERSION = 1
TASKS = ("classification", "regression", "language-model")
