"""Base models in any floating dtype: F16/BF16/F64 checkpoints are accepted for the zoo's F32
parameters, the response states the dtypes they were stored in, and the worker loads each tensor
cast to its parameter's dtype; integer or bool tensors are still refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save

from kernel.access.keys import get_or_create_tenant
from kernel.base_models import registry
from kernel.base_models.dtypes import FLOAT_DTYPES, distinct_dtypes, dtype_fits
from kernel.base_models.expected import expected_tensors
from kernel.base_models.init import resolve_init
from kernel.base_models.registry import check_tensors
from kernel.base_models.safetensors_header import DTYPE_BYTES, TensorEntry
from kernel.config import Settings
from kernel.db.engine import Database
from kernel.reporting.init_report import init_section
from kernel.schemas.jobs import ModelInit
from kernel.storage.blobs import BlobStore
from privtrain_common.zoo.architectures import build_model
from tests.conftest import upload
from training.init_weights import load_into
from worker.runner import JobRunner

QUERY = {
    "name": "half",
    "architecture": "mlp",
    "params": '{"hidden_sizes": [16]}',
    "input_shape": "64",
    "n_outputs": 10,
}
HALF = [(torch.bfloat16, "BF16"), (torch.float16, "F16")]


@pytest.fixture(scope="module")
def mlp_tensors() -> dict[str, tuple[str, tuple[int, ...]]]:
    """The architecture's tensor table, asked of the real child process once for this module."""
    return expected_tensors(
        architecture="mlp", params={"hidden_sizes": [16], "activation": "tanh"}, input_shape=(64,), n_outputs=10
    )


@pytest.fixture(autouse=True)
def _one_child_process(mlp_tensors: dict[str, tuple[str, tuple[int, ...]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every upload here is the same architecture: reuse its table (each child imports torch, ~3 s)."""
    monkeypatch.setattr(registry, "expected_tensors", lambda **_request: mlp_tensors)


def _fp32_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    model = build_model(
        "mlp", {"hidden_sizes": [16]}, input_shape=(64,), n_outputs=10, generator=torch.Generator().manual_seed(seed)
    )
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _file(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> bytes:
    return save({name: tensor.to(dtype).contiguous() for name, tensor in weights.items()})


def test_every_floating_dtype_fits_a_floating_parameter_and_nothing_else_does() -> None:
    for expected in DTYPE_BYTES:
        for found in DTYPE_BYTES:
            fits = dtype_fits(found, expected=expected)
            if expected in FLOAT_DTYPES:
                assert fits is (found in FLOAT_DTYPES), (found, expected)
            else:
                assert fits is (found == expected), (found, expected)


def test_a_mixed_file_fits_and_lists_each_dtype_once() -> None:
    found = {
        "w": TensorEntry(name="w", dtype="BF16", shape=(2, 3)),
        "b": TensorEntry(name="b", dtype="F32", shape=(2,)),
        "v": TensorEntry(name="v", dtype="BF16", shape=(2,)),
    }
    check_tensors(found, {"w": ("F32", (2, 3)), "b": ("F32", (2,)), "v": ("F32", (2,))})
    assert distinct_dtypes(found) == ["BF16", "F32"]


@pytest.mark.parametrize(("dtype", "stored"), HALF)
def test_a_half_precision_base_model_fine_tunes_from_its_values_cast_to_fp32(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes, dtype: torch.dtype, stored: str
) -> None:
    weights = _fp32_weights()
    created = alice.post("/v1/base-models", params=QUERY, content=_file(weights, dtype))
    assert created.status_code == 201, created.text
    base = created.json()
    assert base["stored_dtypes"] == [stored]
    assert alice.get(f"/v1/base-models/{base['id']}").json()["stored_dtypes"] == [stored]
    assert [item["stored_dtypes"] for item in alice.get("/v1/base-models").json()["items"]] == [[stored]]

    dataset = upload(alice, digits_csv).json()  # type: ignore[attr-defined]
    spec = {
        "dataset_id": dataset["id"],
        "model": {"name": "mlp", "params": {"hidden_sizes": [16]}, "init": {"base_model_id": base["id"]}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
        "privacy": {"target_epsilon": 4.0},
        "training": {"steps": 2, "batch_size": 64, "learning_rate": 0.5, "finetune": "head"},
    }
    submitted = alice.post("/v1/jobs", json=spec)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert JobRunner(settings, db=database).run(job_id) == "succeeded"

    path = Path(settings.tmp_dir) / "released.safetensors"
    path.write_bytes(alice.get(f"/v1/jobs/{job_id}/model").content)
    released = load_file(str(path))
    for name in ("1.weight", "1.bias"):  # the frozen hidden layer: exactly what was loaded
        cast = weights[name].to(dtype).to(torch.float32)
        assert released[name].dtype == torch.float32
        assert torch.equal(released[name], cast), name
    assert not torch.equal(weights["1.weight"].to(dtype).float(), weights["1.weight"])  # the rounding is visible

    with database.read_session() as session:
        tenant = get_or_create_tenant(session, "alice")
        init = ModelInit(base_model_id=base["id"])
        provenance = resolve_init(
            session, tenant, init, blobs=BlobStore(settings.blob_dir, settings.tmp_dir)
        ).provenance
        assert "stored_dtypes" not in resolve_init(session, tenant, init).provenance
    assert provenance["stored_dtypes"] == [stored]
    assert f"stored in {stored} and cast to F32" in init_section(provenance)["statement"]  # type: ignore[index]


def test_integer_tensors_are_still_refused(alice: TestClient) -> None:
    tensors = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in _fp32_weights().items()}
    tensors["1.weight"] = torch.ones_like(tensors["1.weight"], dtype=torch.int32)
    refused = alice.post("/v1/base-models", params=QUERY, content=save(tensors))
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert problem["type"].endswith("/base-model-dtype-mismatch") and problem["tensor"] == "1.weight"
    assert "I32" in problem["detail"] and "any floating dtype" in problem["detail"]
    assert alice.get("/v1/base-models").json()["items"] == []


def test_an_fp32_start_says_nothing_about_a_cast() -> None:
    provenance = {
        "kind": "base-model",
        "base_model_id": "bm_1",
        "name": "n",
        "source": None,
        "sha256": "0" * 64,
        "stored_dtypes": ["F32"],
    }
    assert "cast" not in init_section(provenance)["statement"]  # type: ignore[index]


@pytest.mark.parametrize(("dtype", "_stored"), [*HALF, (torch.float64, "F64")])
def test_the_worker_casts_each_tensor_to_its_parameters_dtype(dtype: torch.dtype, _stored: str) -> None:
    params = {"patch_size": 4, "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 8}
    source = build_model("vit", params, input_shape=(3, 8, 8), n_outputs=3, generator=torch.Generator().manual_seed(1))
    stored = {name: tensor.detach().to(dtype) for name, tensor in source.state_dict().items()}
    target = build_model("vit", params, input_shape=(3, 8, 8), n_outputs=3, generator=torch.Generator().manual_seed(2))
    assert load_into(target, stored) == []
    for name, tensor in target.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, stored[name].to(torch.float32)), name
    integers = {**stored, "0.projection.weight": stored["0.projection.weight"].to(torch.int64)}
    with pytest.raises(ValueError, match="floating"):
        load_into(target, integers)
