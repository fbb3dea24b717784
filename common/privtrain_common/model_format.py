"""The model file format's constants, torch-free: the service reads a released file's config
(for the ``format=hf`` download) without torch, and ``model_files`` writes and reads with them."""

from __future__ import annotations

CONFIG_KEY = "privtrain.config"
"""The safetensors metadata key that holds the file's JSON architecture config."""
FORMAT_VERSION = 1
TASKS = ("classification", "regression", "language-model")
ADAPTER_PREFIX = "peft_adapter."
"""An `hf` model fine-tuned with LoRA also carries its PEFT adapter: its tensors, named as in PEFT's
``adapter_model.safetensors`` behind this prefix (the ``format=peft`` download serves them; loading
the model skips them: the model's own tensors hold the adapters merged)."""
