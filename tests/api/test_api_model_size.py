"""Model size is bounded at estimate and submission, before any budget is reserved.

The catalogue's torch-free parameter counts are pinned against the worker's torch modules, so
the limit refuses exactly what the worker would have built.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from app.config import get_settings
from app.db import Database
from app.facts import DatasetFacts
from app.model_catalogue import MODELS, ModelIncompatible, ModelSizeLimits, get_model
from privtrain.architectures import build_model
from tests.conftest import RecordingDispatcher, counts, dp_sgd_spec

HUGE_MLP = {"hidden_sizes": [16384] * 8, "activation": "relu"}
# ~17 M parameters: under the parameter limit, but 256 per-sample gradients of it are ~17 GB.
WIDE_MLP = {"hidden_sizes": [4096, 4096]}


def _spec(dataset_id: str, params: dict[str, Any]) -> dict[str, Any]:
    spec = dp_sgd_spec(dataset_id, target_epsilon=4.0)
    spec["model"] = {"name": "mlp", "params": params}
    return spec


@pytest.mark.parametrize("endpoint", ["/v1/jobs/estimate", "/v1/jobs"])
def test_huge_mlp_is_refused_with_count_and_limit(
    alice: TestClient,
    dataset_id: str,
    database: Database,
    dispatcher: RecordingDispatcher,
    endpoint: str,
) -> None:
    limit = get_settings().max_model_parameters
    response = alice.post(endpoint, json=_spec(dataset_id, HUGE_MLP))
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"] == "/problems/model-incompatible"
    expected = get_model("mlp").parameter_count(
        HUGE_MLP, DatasetFacts(n_rows=1437, feature_shape=(64,), task="classification", n_classes=10)
    )
    assert expected > limit
    assert str(expected) in problem["detail"] and str(limit) in problem["detail"]
    assert counts(database) == (0, 0)  # no job, no RESERVE entry
    assert dispatcher.sent == []
    budget = alice.get(f"/v1/datasets/{dataset_id}/budget").json()
    assert budget["reserved_epsilon"] == 0.0


def test_activation_memory_is_bounded(alice: TestClient, dataset_id: str, database: Database) -> None:
    settings = get_settings()
    response = alice.post("/v1/jobs", json=_spec(dataset_id, WIDE_MLP))
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert str(settings.max_activation_bytes) in detail
    assert f"physical batch of {settings.max_physical_batch_size} rows" in detail
    assert counts(database) == (0, 0)


def test_models_of_ordinary_size_are_admitted(alice: TestClient, dataset_id: str) -> None:
    response = alice.post("/v1/jobs", json=_spec(dataset_id, {"hidden_sizes": [512, 256]}))
    assert response.status_code == 202, response.text


CASES: list[tuple[str, dict[str, Any], DatasetFacts]] = [
    ("logistic-regression", {}, DatasetFacts(10, (7,), "classification", 3)),
    ("logistic-regression", {}, DatasetFacts(10, (1, 28, 28), "classification", 10)),
    ("linear-regression", {}, DatasetFacts(10, (13,), "regression", None)),
    ("linear-regression", {}, DatasetFacts(10, (3, 16, 16), "regression", None)),
    ("mlp", {}, DatasetFacts(10, (13,), "regression", None)),
    ("mlp", {"hidden_sizes": [5, 9, 3]}, DatasetFacts(10, (13,), "classification", 4)),
    ("mlp", {"hidden_sizes": [64] * 8, "activation": "relu"}, DatasetFacts(10, (2, 5, 5), "classification", 2)),
    ("cnn2-gn", {}, DatasetFacts(10, (1, 28, 28), "classification", 10)),
    ("cnn2-gn", {"groups": 2}, DatasetFacts(10, (3, 17, 33), "classification", 2)),
    ("cnn2-gn", {"groups": 16}, DatasetFacts(10, (2, 14, 14), "regression", None)),
    ("cnn2-gn", {"image_shape": [2, 14, 15]}, DatasetFacts(10, (420,), "regression", None)),
]


def _torch_sizes(name: str, params: dict[str, Any], facts: DatasetFacts) -> tuple[int, int]:
    """(parameters, activation values per example) of the module the worker builds."""
    model = build_model(name, params, input_shape=facts.feature_shape, n_outputs=get_model(name).n_outputs(facts))
    produced: list[int] = []

    def count(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        if not isinstance(module, (nn.Flatten, nn.Unflatten)):  # views, no new memory
            produced.append(output[0].numel())

    for module in model.modules():
        if not list(module.children()):
            module.register_forward_hook(count)
    with torch.no_grad():
        model(torch.zeros((1, *facts.feature_shape)))
    return sum(p.numel() for p in model.parameters()), facts.n_features + sum(produced)


def test_every_catalogue_model_is_covered() -> None:
    image_zoo = {"wrn", "resnet-gn", "cnn", "vit"}  # sizes pinned in tests/unit/test_model_catalogue_zoo.py
    text = {"transformer-classifier", "transformer-lm"}  # sizes pinned in tests/unit/test_model_catalogue_text.py
    assert {name for name, _, _ in CASES} | image_zoo | text == set(MODELS.names())


@pytest.mark.parametrize(("name", "params", "facts"), CASES)
def test_catalogue_sizes_equal_torch(name: str, params: dict[str, Any], facts: DatasetFacts) -> None:
    definition = get_model(name)
    normalised = definition.validate(params, facts)
    parameters, activations = _torch_sizes(name, normalised, facts)
    assert definition.parameter_count(normalised, facts) == parameters
    size = definition.size(definition.params_model.model_validate(normalised), facts, definition.n_outputs(facts))
    assert size.activations == activations


def test_limits_refuse_with_count_and_limit() -> None:
    facts = DatasetFacts(n_rows=100, feature_shape=(10,), task="classification", n_classes=3)
    model = get_model("logistic-regression")  # 10·3 + 3 = 33 parameters
    roomy = ModelSizeLimits(max_parameters=33, max_activation_bytes=10**9, physical_batch_size=8)
    assert model.validate({}, facts, limits=roomy) == {}
    tight = ModelSizeLimits(max_parameters=32, max_activation_bytes=10**9, physical_batch_size=8)
    with pytest.raises(ModelIncompatible, match=r"33 trainable parameters.*limit is 32"):
        model.validate({}, facts, limits=tight)
    # 8 rows × 4 bytes × (2 × 13 activations + 33 parameters) = 1888 bytes
    memory = ModelSizeLimits(max_parameters=33, max_activation_bytes=1887, physical_batch_size=8)
    with pytest.raises(ModelIncompatible, match=r"1888 bytes.*limit is 1887 bytes"):
        model.validate({}, facts, limits=memory)


def test_the_services_own_settings_set_the_limits(tmp_path: Any, digits_csv: bytes) -> None:
    """The limit is the running service's setting, not whatever the process environment says."""
    from app.bootstrap import migrate
    from app.main import create_app
    from tests.conftest import make_settings, new_key, upload

    settings = make_settings(tmp_path / "data", max_model_parameters=1000)
    migrate(settings)
    database = Database(settings.resolved_database_url)
    try:
        with TestClient(create_app(settings, dispatcher=RecordingDispatcher())) as client:
            client.headers["Authorization"] = f"Bearer {new_key(database, 'tight')}"
            dataset = upload(client, digits_csv).json()
            small = client.post("/v1/jobs/estimate", json=_spec(dataset["id"], {"hidden_sizes": [32]}))
            assert small.status_code == 422, small.text
            detail = small.json()["detail"]
            assert "2410 trainable parameters" in detail and "limit is 1000" in detail, detail
    finally:
        database.dispose()
