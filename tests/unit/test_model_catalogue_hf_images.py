"""The `hf` image classifiers (ViT, ConvNeXt) in the torch-free catalogue: the dataset's images
must be the config's, sizes and blocks equal the model Transformers builds, and what would break
exact per-example gradients (dropout, stochastic depth) is refused by name."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kernel.datasets.facts import DatasetFacts
from kernel.model_catalogue import ModelIncompatible, ModelSizeLimits, get_model
from privtrain_common.zoo.architectures import build_model
from tests.unit.worker.hf_image_fixtures import IMAGE_SHAPE, IMAGE_TYPES, image_config
from training.finetune import block_names

ROOMY = ModelSizeLimits(max_parameters=10**9, max_activation_bytes=10**12, physical_batch_size=8)


def _facts(shape: tuple[int, ...] = IMAGE_SHAPE, task: str = "classification") -> DatasetFacts:
    return DatasetFacts(n_rows=100, feature_shape=shape, task=task, n_classes=4 if task == "classification" else None)


def _validate(config: dict[str, Any], facts: DatasetFacts | None = None) -> dict[str, Any]:
    return get_model("hf").validate({"task": "image-classification", "config": config}, facts or _facts(), limits=ROOMY)


@pytest.mark.parametrize(
    "config", [*(image_config(t) for t in IMAGE_TYPES), {**image_config("vit"), "qkv_bias": False}]
)
def test_size_and_blocks_equal_the_model_transformers_builds(config: dict[str, Any]) -> None:
    facts = _facts()
    params = _validate(config)
    definition = get_model("hf")
    model = build_model("hf", params, input_shape=IMAGE_SHAPE, n_outputs=definition.n_outputs(facts))
    assert definition.parameter_count(params, facts) == sum(p.numel() for p in model.parameters())
    assert definition.block_names(params) == block_names(model)
    assert block_names(model)[1] == ("stage1" if config["model_type"] == "convnext" else "layer1")


def test_a_larger_convnext_counts_exactly() -> None:
    config = {**image_config("convnext"), "hidden_sizes": [4, 6, 8], "depths": [2, 1, 1], "layer_scale_init_value": 0}
    params = _validate({**config, "image_size": 16}, _facts((3, 16, 16)))
    model = build_model("hf", params, input_shape=(3, 16, 16), n_outputs=4)
    assert get_model("hf").parameter_count(params, _facts((3, 16, 16))) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", IMAGE_TYPES)
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 16, 16), (12,)])
def test_images_of_another_shape_are_refused_naming_both(model_type: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(
        ModelIncompatible,
        match="num_channels 3 and image_size 8.*the dataset's rows are " + re.escape(str(list(shape))),
    ):
        _validate(image_config(model_type), _facts(shape))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**image_config("vit"), "hidden_dropout_prob": 0.1}, "dropout is always 0"),
        ({**image_config("convnext"), "drop_path_rate": 0.1}, r"stochastic depth \(drop_path_rate\) is always 0"),
        ({**image_config("vit"), "encoder_stride": 4}, r"\['encoder_stride'\] are not accepted"),
        ({**image_config("vit"), "qkv_bias": 1}, r"config\.qkv_bias has the wrong type"),
        ({**image_config("vit"), "patch_size": 16}, "larger than config.image_size"),
        ({**image_config("vit"), "hidden_size": 9}, "must divide the hidden size"),
        ({**image_config("convnext"), "depths": [1]}, "one size per stage"),
        ({**image_config("convnext"), "depths": [1, 0]}, "between 1 and"),
        ({**image_config("convnext"), "num_stages": 3}, "num_stages"),
        ({**image_config("convnext"), "layer_scale_init_value": -1.0}, "must not be negative"),
        ({**image_config("convnext"), "patch_size": 8}, "too small for patch_size 8 and 2 stages"),
    ],
)
def test_configs_that_break_exactness_or_shapes_are_refused(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelIncompatible, match=message):
        _validate(config)


def test_image_models_train_on_classification_datasets_only() -> None:
    with pytest.raises(ModelIncompatible, match="trains on a classification dataset"):
        _validate(image_config("vit"), _facts(task="language-model"))


def test_text_families_do_not_serve_image_classification() -> None:
    with pytest.raises(ModelIncompatible, match="serves"):
        _validate(
            {
                "model_type": "bert",
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 8,
                "max_position_embeddings": 8,
            }
        )
