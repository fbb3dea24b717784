"""The zoo is defined once: the service's catalogue and the torch builders both read the table in
``privtrain_common.zoo.catalogue`` (names, parameter declarations with their defaults and bounds)."""

from __future__ import annotations

import pytest
import torch

from kernel.datasets.facts import DatasetFacts
from kernel.model_catalogue import MODELS, ModelIncompatible, ModelSizeLimits, get_model
from privtrain_common.zoo.architectures import MODEL_REGISTRY, build_model, register_model
from privtrain_common.zoo.catalogue import CATALOGUE, default_params
from privtrain_common.zoo.params import bounds, declared_fields

IMAGES = DatasetFacts(n_rows=10, feature_shape=(3, 8, 8), task="classification", n_classes=4)
ROOMY = ModelSizeLimits(max_parameters=10**9, max_activation_bytes=10**12, physical_batch_size=8)


def test_the_service_and_the_builders_know_exactly_the_tables_names() -> None:
    assert list(MODELS) == list(CATALOGUE)  # the order GET /v1/models lists them in
    assert set(MODEL_REGISTRY) == set(CATALOGUE)


def test_a_builder_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the zoo's catalogue"):
        register_model("mlp-unlisted")(MODEL_REGISTRY["mlp"])
    assert "mlp-unlisted" not in MODEL_REGISTRY


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_the_published_schema_is_the_declaration(name: str) -> None:
    definition = get_model(name)
    assert definition.params_model().model_dump() == default_params(name)
    schema = definition.params_model.model_json_schema()
    assert schema["title"] == CATALOGUE[name].params.__name__ and schema["additionalProperties"] is False
    properties = schema.get("properties", {})
    assert list(properties) == [declared.name for declared in declared_fields(CATALOGUE[name].params)]
    for declared in declared_fields(CATALOGUE[name].params):
        limits, published = bounds(declared), properties[declared.name]
        options = published.get("anyOf", [published])  # an optional field: [the bounded type, null]
        expected = {
            "minimum": limits.ge,
            "maximum": limits.le,
            "minItems": limits.min_length,
            "maxItems": limits.max_length,
        }
        for key, value in expected.items():
            assert value is None or any(option.get(key) == value for option in options), (name, declared.name, key)
        assert published.get("description") == limits.description


def test_defaults_are_fresh_per_use() -> None:
    first = default_params("resnet-gn")
    first["blocks"].append(99)  # type: ignore[attr-defined]
    assert default_params("resnet-gn")["blocks"] == [2, 2, 2, 2]


def test_a_declared_rule_reads_as_the_apis_validation_error() -> None:
    with pytest.raises(ModelIncompatible, match=r"Value error, heads \(3\) must divide dim \(10\)"):
        get_model("vit").validate({"dim": 10, "heads": 3}, IMAGES, limits=ROOMY)


def test_the_builders_take_the_tables_defaults() -> None:
    vit = build_model("vit", {}, input_shape=(3, 8, 8), n_outputs=4)
    assert vit[1].token.shape[-1] == default_params("vit")["dim"]  # the class token's width
    mlp = build_model("mlp", {}, input_shape=(5,), n_outputs=2)
    hidden = next(layer for layer in mlp if isinstance(layer, torch.nn.Linear))
    assert [hidden.out_features] == default_params("mlp")["hidden_sizes"]
    normalised = get_model("mlp").validate(
        {}, DatasetFacts(n_rows=1, feature_shape=(5,), task="regression", n_classes=None), limits=ROOMY
    )
    assert normalised == default_params("mlp")
