"""A saved ViT or ConvNeXt classifier's config.json read as a base-model upload: the task its class
names, the (C, H, W) input, and the tensors of the model a job on it builds, under the names
``save_pretrained`` writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from privtrain_common.zoo.hf.builder import transformers_model
from privtrain_common.zoo.hf.checkpoint import CheckpointRefused, task_of
from privtrain_common.zoo.hf.transformers_config import saved_name
from privtrain_common.zoo.parameter_shapes import hf_checkpoint
from tests.unit.worker.hf_image_fixtures import IMAGE_TYPES, image_config


def _saved(model_type: str, tmp_path: Path, **extra: Any) -> tuple[dict[str, Any], set[str]]:
    """config.json and the tensor names of a tiny classifier saved by Transformers."""
    import transformers  # heavy: these tests only
    from safetensors import safe_open  # only these tests read the weights back

    sizes = {key: value for key, value in image_config(model_type).items() if key != "model_type"}
    config = transformers.AutoConfig.for_model(model_type, **sizes, num_labels=4, **extra)
    if model_type == "convnext":
        config.num_stages = len(sizes["depths"])
    transformers.AutoModelForImageClassification.from_config(config).save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    return json.loads((tmp_path / "config.json").read_text()), names


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
def test_a_saved_image_classifier_reads_as_an_image_classification_base_model(model_type: str, tmp_path: Path) -> None:
    config, names = _saved(model_type, tmp_path)
    answer = hf_checkpoint(config, task=None)
    assert answer["task"] == "image-classification" and answer["labels"] == 4
    assert answer["model_class"].endswith("ForImageClassification")
    tensors: dict[str, Any] = answer["tensors"]  # type: ignore[assignment]
    expected = {saved_name(model_type, name.removeprefix("model.")) for name in tensors}
    assert expected == names  # every tensor found under the name save_pretrained wrote


def test_a_checkpoint_with_stochastic_depth_is_taken_with_it_off(tmp_path: Path) -> None:
    config, _ = _saved("convnext", tmp_path, drop_path_rate=0.2)
    assert "drop_path_rate" not in hf_checkpoint(config, task=None)["params"]["config"]  # type: ignore[index]


def test_an_unknown_class_names_the_image_task() -> None:
    with pytest.raises(CheckpointRefused, match="task=image-classification"):
        task_of({"architectures": ["ViTModel"]}, None)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_decoders_rope_base_is_taken_and_another_rope_type_is_refused(model_type: str, tmp_path: Path) -> None:
    """Qwen2 checkpoints use a RoPE base of 10⁶: read from Transformers 5's ``rope_parameters`` (and the
    older top-level ``rope_theta``), kept in the job's config, built into the model; a scaled RoPE is
    refused by name."""
    import transformers  # heavy: these tests only

    sizes = {
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 8,
    }
    config = transformers.AutoConfig.for_model(model_type, vocab_size=20, rope_theta=1e6, **sizes)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["rope_parameters"]["rope_theta"] == 1e6
    for shown in (saved, {**{k: v for k, v in saved.items() if k != "rope_parameters"}, "rope_theta": 1e6}):
        params = hf_checkpoint(shown, task=None)["params"]
        assert params["config"]["rope_theta"] == 1e6  # type: ignore[index]
    built = transformers_model(params["config"], task="causal-lm", n_outputs=20)  # type: ignore[arg-type,index]
    assert built.config.rope_parameters["rope_theta"] == 1e6
    scaled = {**saved, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
    with pytest.raises(CheckpointRefused, match="rope_parameters"):
        hf_checkpoint(scaled, task=None)
