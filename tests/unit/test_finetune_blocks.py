"""Fine-tuning blocks: every zoo model declares them, the torch-free catalogue lists the same ones
from the params alone (so ``finetune_k`` is checked at submission), and ``last_k_blocks`` freezes
exactly the parameters outside the last k."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save

from kernel.config import Settings
from kernel.datasets.facts import DatasetFacts
from kernel.db.engine import Database
from kernel.errors import FinetuneKOutOfRange
from kernel.model_catalogue import MODELS, ModelSizeLimits, get_model
from privtrain_common.zoo.architectures import build_model
from tests.conftest import counts, upload
from training.finetune import apply_finetune, block_members, block_names


def _facts(shape: tuple[int, ...], n_classes: int = 3) -> DatasetFacts:
    return DatasetFacts(n_rows=20, feature_shape=shape, task="classification", n_classes=n_classes)


IMAGE = (3, 8, 8)
ROOMY = ModelSizeLimits(max_parameters=10**12, max_activation_bytes=10**15, physical_batch_size=1)
"""The defaults of the big image models exceed the test service's limits; blocks do not depend on size."""
CASES: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("logistic-regression", {}, (6,)),
    ("mlp", {}, (6,)),
    ("mlp", {"hidden_sizes": [5, 4, 3]}, (6,)),
    ("cnn2-gn", {}, (1, 14, 14)),
    ("cnn2-gn", {"image_shape": [1, 14, 14]}, (196,)),
    ("wrn", {}, IMAGE),
    ("wrn", {"depth": 10, "width": 1, "groups": 4}, IMAGE),
    ("wrn", {"depth": 22, "width": 1, "groups": 4, "weight_standardisation": False}, IMAGE),
    ("resnet-gn", {}, IMAGE),
    ("resnet-gn", {"blocks": [1, 3], "width": 4, "groups": 2}, IMAGE),
    ("cnn", {}, IMAGE),
    ("cnn", {"channels": [4], "groups": 2}, IMAGE),
    ("vit", {}, IMAGE),
    ("vit", {"patch_size": 4, "dim": 8, "depth": 3, "heads": 2, "mlp_dim": 16}, IMAGE),
]


def _meta_model(name: str, params: dict[str, Any], shape: tuple[int, ...], n_outputs: int = 3) -> torch.nn.Module:
    with torch.device("meta"):  # names only: no memory for the weights
        return build_model(name, params, input_shape=shape, n_outputs=n_outputs)


def test_every_registered_model_is_covered() -> None:
    text = {"transformer-classifier", "transformer-lm"}  # need text facts: tests/unit/test_model_catalogue_text.py
    hf = {"hf"}  # blocks per model type: tests/unit/test_model_catalogue_hf.py
    assert {name for name, _, _ in CASES} | {"linear-regression"} | text | hf == set(MODELS.names())


@pytest.mark.parametrize(("name", "params", "shape"), CASES)
def test_the_catalogue_lists_the_blocks_the_worker_builds(
    name: str, params: dict[str, Any], shape: tuple[int, ...]
) -> None:
    definition = get_model(name)
    normalised = definition.validate(params, _facts(shape), limits=ROOMY)
    model = _meta_model(name, normalised, shape)
    assert definition.block_names(normalised) == block_names(model)
    assert definition.block_count(normalised) == len(block_names(model))
    assert block_names(model)[-1] == "head"


@pytest.mark.parametrize(("name", "params", "shape"), CASES)
def test_blocks_hold_every_parameter_exactly_once(name: str, params: dict[str, Any], shape: tuple[int, ...]) -> None:
    model = _meta_model(name, get_model(name).validate(params, _facts(shape), limits=ROOMY), shape)
    owners: dict[str, list[str]] = {}
    for block, members in block_members(model).items():
        for parameter, _ in model.named_parameters():
            if any(parameter.startswith(f"{member}.") for member in members):
                owners.setdefault(parameter, []).append(block)
    assert {name: len(blocks) for name, blocks in owners.items()} == {n: 1 for n, _ in model.named_parameters()}


def test_linear_regression_has_one_block() -> None:
    assert get_model("linear-regression").block_names({}) == block_names(
        build_model("linear-regression", {}, input_shape=(4,), n_outputs=1)
    )


def _trainable(model: torch.nn.Module) -> set[str]:
    return {name for name, parameter in model.named_parameters() if parameter.requires_grad}


def test_wrn_last_blocks_are_the_head_then_the_last_residual_block() -> None:
    """WRN-10-1: stem (0), one residual block per stage (1, 2, 3), final GroupNorm (4) and Linear (8)."""
    params = {"depth": 10, "width": 1, "groups": 4}
    model = build_model("wrn", params, input_shape=IMAGE, n_outputs=3)
    assert block_names(model) == ["stem", "stage1.block1", "stage2.block1", "stage3.block1", "head"]
    head = {"4.weight", "4.bias", "8.weight", "8.bias"}
    apply_finetune(model, mode="last_k_blocks", k=1)
    assert _trainable(model) == head
    apply_finetune(model, mode="last_k_blocks", k=2)
    last_block = {name for name, _ in model.named_parameters() if name.startswith("3.")}
    assert last_block and _trainable(model) == head | last_block
    assert not any(name.startswith(("0.", "1.", "2.")) for name in _trainable(model))
    apply_finetune(model, mode="last_k_blocks", k=5)
    assert _trainable(model) == {name for name, _ in model.named_parameters()}  # every block: the full model


def test_vit_last_blocks_are_the_head_then_the_last_transformer_block() -> None:
    """ViT of depth 2: embedding (0, 1, 2), blocks (3, 4), final LayerNorm (5), class token (6), Linear (7)."""
    params = {"patch_size": 4, "dim": 8, "depth": 2, "heads": 2, "mlp_dim": 16}
    model = build_model("vit", params, input_shape=IMAGE, n_outputs=3)
    assert block_names(model) == ["embedding", "block1", "block2", "head"]
    head = {"5.weight", "5.bias", "7.weight", "7.bias"}
    apply_finetune(model, mode="last_k_blocks", k=1)
    assert _trainable(model) == head
    apply_finetune(model, mode="last_k_blocks", k=2)
    last_block = {name for name, _ in model.named_parameters() if name.startswith("4.")}
    assert "4.attention.q.weight" in last_block and _trainable(model) == head | last_block
    apply_finetune(model, mode="last_k_blocks", k=4)
    assert "1.token" in _trainable(model) and "2.embedding" in _trainable(model)
    with pytest.raises(ValueError, match="finetune_k"):
        apply_finetune(model, mode="last_k_blocks", k=5)


def test_the_catalogue_refuses_a_k_above_the_block_count() -> None:
    wrn = get_model("wrn")
    params = wrn.validate({"depth": 10, "width": 1, "groups": 4}, _facts(IMAGE))
    wrn.check_finetune_k(params, 5)
    with pytest.raises(FinetuneKOutOfRange) as refused:
        wrn.check_finetune_k(params, 6)
    assert refused.value.slug == "finetune-k-out-of-range"
    assert refused.value.extra == {
        "finetune_k": 6,
        "block_count": 5,
        "blocks": ["stem", "stage1.block1", "stage2.block1", "stage3.block1", "head"],
    }


def test_the_models_catalogue_lists_the_default_blocks(alice: TestClient) -> None:
    items = {item["name"]: item for item in alice.get("/v1/models").json()["items"]}
    assert items["wrn"]["finetune_blocks"] == [
        "stem",
        *(f"stage{s}.block{b}" for s in (1, 2, 3) for b in (1, 2)),
        "head",
    ]
    assert items["vit"]["finetune_blocks"] == ["embedding", *(f"block{n}" for n in range(1, 7)), "head"]
    for name, item in items.items():
        assert item["finetune_blocks"] == get_model(name).block_names(item["defaults"])


def test_submission_refuses_finetune_k_above_the_block_count(
    alice: TestClient, settings: Settings, database: Database, digits_csv: bytes
) -> None:
    """An mlp with one hidden layer has two blocks (hidden1, head): k = 3 is a 422 before any
    reservation, at estimate and at submission; k = 2 is admitted."""
    model = build_model("mlp", {"hidden_sizes": [16]}, input_shape=(64,), n_outputs=10)
    body = save({name: tensor.contiguous() for name, tensor in model.state_dict().items()})
    query = {
        "name": "m",
        "architecture": "mlp",
        "params": '{"hidden_sizes": [16]}',
        "input_shape": "64",
        "n_outputs": 10,
    }
    base = alice.post("/v1/base-models", params=query, content=body).json()
    dataset = upload(alice, digits_csv).json()  # type: ignore[attr-defined]

    def spec(k: int) -> dict[str, Any]:
        return {
            "dataset_id": dataset["id"],
            "model": {"name": "mlp", "params": {"hidden_sizes": [16]}, "init": {"base_model_id": base["id"]}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
            "privacy": {"target_epsilon": 4.0},
            "training": {
                "steps": 2,
                "batch_size": 64,
                "learning_rate": 0.5,
                "finetune": "last_k_blocks",
                "finetune_k": k,
            },
        }

    for endpoint in ("/v1/jobs/estimate", "/v1/jobs"):
        refused = alice.post(endpoint, json=spec(3))
        assert refused.status_code == 422, refused.text
        problem = refused.json()
        assert problem["type"].endswith("/finetune-k-out-of-range")
        assert problem["block_count"] == 2 and problem["blocks"] == ["hidden1", "head"]
    assert counts(database) == (0, 0)  # no job, no reservation
    assert alice.post("/v1/jobs", json=spec(2)).status_code == 202
