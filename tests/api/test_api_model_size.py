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

import worker.train as train_module
from kernel.config import Settings, get_settings
from kernel.datasets.facts import DatasetFacts
from kernel.datasets.stored_facts import facts_of
from kernel.db.engine import Database
from kernel.db.orm import Dataset, Job
from kernel.model_catalogue import MODELS, ModelIncompatible, ModelSizeLimits, get_model
from kernel.schemas.stored_spec import stored_spec
from privtrain_common.zoo.architectures import build_model
from tests.conftest import RecordingDispatcher, counts, dp_sgd_spec
from worker.runner import JobRunner

HUGE_MLP = {"hidden_sizes": [16384] * 8, "activation": "relu"}
# ~17 M parameters: under the parameter limit, but 256 per-sample gradients of it are ~17 GB, so
# the worker takes fewer rows per chunk.
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


def test_a_wide_model_trains_in_smaller_chunks_and_a_row_too_large_is_refused(
    alice: TestClient, dataset_id: str, database: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """256 per-sample gradients of WIDE_MLP would not fit the activation limit; the job is admitted
    and the worker takes fewer rows per chunk. A model whose single row does not fit is refused."""
    digits = DatasetFacts(n_rows=1437, feature_shape=(64,), task="classification", n_classes=10)
    definition = get_model("mlp")
    normalised = definition.validate(WIDE_MLP, digits)
    limits = ModelSizeLimits.from_settings(get_settings())
    size = definition.size(definition.params_model.model_validate(normalised), digits, 10)
    assert size.batch_bytes(limits.physical_batch_size) > limits.max_activation_bytes
    expected_chunk = limits.max_activation_bytes // size.batch_bytes(1)
    assert 1 <= expected_chunk < limits.physical_batch_size
    assert definition.rows_per_chunk(normalised, digits, limits=limits) == expected_chunk
    assert alice.post("/v1/jobs/estimate", json=_spec(dataset_id, WIDE_MLP)).status_code == 200

    # The worker runs a small job in chunks its own settings fit: here 3 rows of a tiny MLP.
    tiny = {"hidden_sizes": [16]}
    row_bytes = definition.size(
        definition.params_model.model_validate(definition.validate(tiny, digits)), digits, 10
    ).batch_bytes(1)
    spec = _spec(dataset_id, tiny)
    spec["training"] = {"steps": 2, "batch_size": 16, "learning_rate": 0.1}
    seen: list[int] = []
    real = train_module.get_trainer

    def spying_get_trainer(name: str) -> Any:
        trainer = real(name)

        def spy(request: Any) -> Any:
            seen.append(request.max_physical_batch_size)
            return trainer(request)

        return spy

    monkeypatch.setattr(train_module, "get_trainer", spying_get_trainer)
    tight = settings.model_copy(update={"max_activation_bytes": 3 * row_bytes + row_bytes // 2})
    submitted = alice.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    assert JobRunner(tight, db=database).run(submitted.json()["id"]) == "succeeded"
    assert seen == [3]

    one_row = ModelSizeLimits(
        max_parameters=limits.max_parameters, max_activation_bytes=size.batch_bytes(1) - 1, physical_batch_size=256
    )
    with pytest.raises(ModelIncompatible, match=rf"{size.batch_bytes(1)} bytes .* for a single row"):
        definition.validate(WIDE_MLP, digits, limits=one_row)


def test_a_gpu_worker_takes_larger_chunks_in_a_share_of_its_memory(
    alice: TestClient, dataset_id: str, database: Database, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the chunk is gpu_max_physical_batch_size rows, or as many as fit
    gpu_activation_memory_fraction of the device's memory (never less than the CPU's budget)."""
    digits = DatasetFacts(n_rows=1437, feature_shape=(64,), task="classification", n_classes=10)
    definition = get_model("mlp")
    params = definition.validate(WIDE_MLP, digits)
    size = definition.size(definition.params_model.model_validate(params), digits, 10)
    cpu = ModelSizeLimits.from_settings(settings)
    assert cpu.physical_batch_size == 256 and cpu.rows_per_chunk(size) < 256  # CPU: memory-bound

    gpu = ModelSizeLimits.for_gpu(settings, device_memory_bytes=80 * 1024**3)
    assert gpu.physical_batch_size == 2048
    assert gpu.max_activation_bytes == int(0.4 * 80 * 1024**3)
    assert gpu.rows_per_chunk(size) == min(2048, int(0.4 * 80 * 1024**3) // size.batch_bytes(1))
    small = ModelSizeLimits.for_gpu(settings, device_memory_bytes=1024**3)  # a share under the CPU's budget
    assert small.max_activation_bytes == settings.max_activation_bytes

    # The runner asks the device's memory and uses these limits for a CUDA device.
    submitted = alice.post("/v1/jobs", json=_spec(dataset_id, WIDE_MLP))
    assert submitted.status_code == 202, submitted.text
    monkeypatch.setattr(train_module, "_device_memory_bytes", lambda device: 80 * 1024**3)
    with database.session() as session:
        job = session.get(Job, submitted.json()["id"])
        dataset = session.get(Dataset, dataset_id)
        assert job is not None and dataset is not None
        params, facts = stored_spec(job).model.params, facts_of(dataset)
        on_gpu, on_cpu = (
            train_module.rows_per_chunk(
                settings, model_name=job.model_name, params=params, facts=facts, device=torch.device(device)
            )
            for device in ("cuda", "cpu")
        )
    assert on_gpu == gpu.rows_per_chunk(size) > on_cpu == cpu.rows_per_chunk(size)


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
    hf = {"hf"}  # parameter counts pinned per model type in tests/unit/test_model_catalogue_hf.py
    assert {name for name, _, _ in CASES} | image_zoo | text | hf == set(MODELS.names())


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
    # one row: 4 bytes × (2 × 13 activations + 33 parameters) = 236 bytes, so 1887 bytes hold 7 rows
    memory = ModelSizeLimits(max_parameters=33, max_activation_bytes=1887, physical_batch_size=8)
    assert model.validate({}, facts, limits=memory) == {}
    assert model.rows_per_chunk({}, facts, limits=memory) == 7
    assert model.rows_per_chunk({}, facts, limits=roomy) == 8
    too_small = ModelSizeLimits(max_parameters=33, max_activation_bytes=235, physical_batch_size=8)
    with pytest.raises(ModelIncompatible, match=r"236 bytes.*single row.*235 bytes"):
        model.validate({}, facts, limits=too_small)


def test_the_services_own_settings_set_the_limits(tmp_path: Any, digits_csv: bytes) -> None:
    """The limit is the running service's setting, not whatever the process environment says."""
    from api.main import create_app
    from kernel.bootstrap import migrate
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
