"""Model artifacts: safetensors only, config in metadata, exact round trip, strict loading."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from dp.loop.state import TrainingState
from dp.randomness.secure_random import SecureRandom
from privtrain_common.model_files import CONFIG_KEY, load_model, save_model
from privtrain_common.zoo.architectures import MODEL_REGISTRY, build_model
from tests.unit.worker.hf_fixtures import hf_config
from training.artifacts import load_training_state, save_training_state

# (name, params, input_shape, n_outputs, task)
ZooCase = tuple[str, dict[str, object], list[int], int, str]
ZOO: list[ZooCase] = [
    ("logistic-regression", {}, [8], 3, "classification"),
    ("linear-regression", {}, [2, 3], 1, "regression"),
    ("mlp", {"hidden_sizes": [16, 8], "activation": "relu"}, [6], 4, "classification"),
    ("mlp", {"hidden_sizes": [5], "activation": "tanh"}, [6], 1, "regression"),
    ("cnn2-gn", {"groups": 4, "image_shape": None}, [1, 28, 28], 10, "classification"),
    ("cnn2-gn", {"groups": 8, "image_shape": [3, 16, 16]}, [768], 5, "classification"),
    ("wrn", {"depth": 10, "width": 1, "groups": 4, "weight_standardisation": True}, [3, 8, 8], 3, "classification"),
    ("resnet-gn", {"blocks": [1, 1], "width": 4, "groups": 2}, [3, 8, 8], 3, "classification"),
    ("cnn", {"channels": [4, 8], "groups": 2, "activation": "relu", "pooling": "max"}, [1, 8, 8], 2, "regression"),
    ("vit", {"patch_size": 4, "dim": 8, "depth": 1, "heads": 2, "mlp_dim": 16}, [3, 8, 8], 3, "classification"),
    (
        "transformer-classifier",
        {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8, "vocab_size": 20, "pad_id": 0, "pooling": "mean"},
        [6],
        3,
        "classification",
    ),
    (
        "transformer-lm",
        {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8, "vocab_size": 20, "pad_id": 0},
        [6],
        20,
        "language-model",
    ),
    (
        "hf",
        {"task": "sequence-classification", "config": {**hf_config("bert"), "vocab_size": 20, "pad_token_id": 0}},
        [6],
        3,
        "classification",
    ),
    (
        "hf",
        {"task": "causal-lm", "config": {**hf_config("gpt2"), "vocab_size": 20, "pad_token_id": 0}},
        [6],
        20,
        "language-model",
    ),
]


def _config(
    name: str, params: dict[str, object], input_shape: list[int], n_outputs: int, task: str
) -> dict[str, object]:
    return {
        "format_version": 1,
        "model": {"name": name, "params": params},
        "input_shape": input_shape,
        "n_outputs": n_outputs,
        "task": task,
        "job_id": "job-123",  # extra keys travel along untouched
    }


def _build(config: dict[str, object], seed: int = 0) -> nn.Module:
    model = config["model"]
    assert isinstance(model, dict)
    return build_model(
        model["name"],
        model["params"],
        input_shape=tuple(config["input_shape"]),
        n_outputs=config["n_outputs"],
        generator=torch.Generator().manual_seed(seed),
    )


def test_every_zoo_model_is_covered() -> None:
    assert {case[0] for case in ZOO} == set(MODEL_REGISTRY)


@pytest.mark.parametrize("case", ZOO, ids=[f"{c[0]}-{i}" for i, c in enumerate(ZOO)])
def test_round_trip_reproduces_outputs_exactly(case: ZooCase, tmp_path: Path) -> None:
    config = _config(*case)
    model = _build(config)
    path = tmp_path / "model.safetensors"
    digest = save_model(path, model, config=config)
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no temp left

    global_rng = torch.get_rng_state()
    loaded, loaded_config = load_model(path)
    assert torch.equal(torch.get_rng_state(), global_rng)  # loading never perturbs training RNG
    assert loaded_config == config
    assert not loaded.training
    x = torch.randn(4, *config["input_shape"], generator=torch.Generator().manual_seed(1))
    if case[0].startswith("transformer-") or case[0] == "hf":  # text models take token ids
        x = torch.randint(0, 20, (4, *config["input_shape"]), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_file_is_plain_safetensors_with_the_config_in_metadata(tmp_path: Path) -> None:
    config = _config(*ZOO[2])
    model = _build(config)
    path = tmp_path / "m.safetensors"
    save_model(path, model, config=config)

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        assert json.loads(handle.metadata()[CONFIG_KEY]) == config
        assert set(handle.keys()) == set(model.state_dict())

    # Byte level: u64 header length, a JSON header, then raw tensor bytes and nothing else —
    # no pickle stream, no torch.save zip archive.
    raw = path.read_bytes()
    assert not raw.startswith(b"PK") and not raw.startswith(b"\x80")
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    data_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert len(raw) == 8 + header_len + data_bytes
    assert all(entry["dtype"] == "F32" for key, entry in header.items() if key != "__metadata__")


def test_saving_is_deterministic(tmp_path: Path) -> None:
    config = _config(*ZOO[0])
    model = _build(config)
    assert save_model(tmp_path / "a", model, config=config) == save_model(tmp_path / "b", model, config=config)


def _rewrite_metadata(path: Path, metadata: dict[str, str]) -> None:
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        # safe_open is not iterable (SIM118 does not apply): keys() is how it lists its tensors
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}  # noqa: SIM118
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c["model"].__setitem__("name", "evil-model"), "unknown model"),
        (lambda c: c.__setitem__("format_version", 2), "format_version"),
        (lambda c: c.__setitem__("task", "clustering"), "task"),
        (lambda c: c.__setitem__("input_shape", "8"), "input_shape"),
        (lambda c: c["model"]["params"].__setitem__("hidden_sizes", [17, 8]), "do not match"),
        (lambda c: c["model"]["params"].__setitem__("eval", "os.system"), "unknown parameter"),
    ],
    ids=["unknown-name", "version", "task", "input-shape", "mismatched-tensors", "unknown-param"],
)
def test_tampered_metadata_is_refused(mutate: Callable[[dict[str, Any]], None], message: str, tmp_path: Path) -> None:
    config = _config(*ZOO[2])
    path = tmp_path / "m.safetensors"
    save_model(path, _build(config), config=config)
    tampered = json.loads(json.dumps(config))
    mutate(tampered)
    _rewrite_metadata(path, {CONFIG_KEY: json.dumps(tampered)})
    with pytest.raises(ValueError, match=message):
        load_model(path)


def test_files_without_config_or_not_safetensors_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match=re.escape("no 'privtrain.config'")):
        load_model(path)
    _rewrite_metadata(path, {CONFIG_KEY: "{not json"})
    with pytest.raises(ValueError, match="malformed"):
        load_model(path)
    pickle_path = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(2)}, pickle_path)
    with pytest.raises(ValueError, match="not a readable safetensors"):
        load_model(pickle_path)


def test_save_refuses_a_config_that_does_not_describe_the_model(tmp_path: Path) -> None:
    config = _config(*ZOO[2])
    wrong = json.loads(json.dumps(config))
    wrong["n_outputs"] = 7
    with pytest.raises(ValueError, match="do not match"):
        save_model(tmp_path / "m.safetensors", _build(config), config=wrong)
    incomplete = {k: v for k, v in config.items() if k != "task"}
    with pytest.raises(ValueError, match="task"):
        save_model(tmp_path / "m.safetensors", _build(config), config=incomplete)
    assert list(tmp_path.iterdir()) == []


def test_save_moves_tensors_to_cpu_and_makes_them_contiguous(tmp_path: Path) -> None:
    config = _config(*ZOO[0])
    model = _build(config)
    with torch.no_grad():
        weight = model[1].weight
        weight.set_(weight.detach().t().contiguous().t())  # same values, transposed strides
    assert not model[1].weight.is_contiguous()
    save_model(tmp_path / "m.safetensors", model, config=config)
    loaded, _ = load_model(tmp_path / "m.safetensors")
    assert torch.equal(loaded[1].weight, model[1].weight)


def test_training_state_round_trip(tmp_path: Path) -> None:
    momentum = torch.randn(3, 2)
    state = TrainingState(
        step=17,
        model_state={"0.weight": torch.randn(3, 2), "0.bias": torch.randn(3)},
        optimizer_state={
            "state": {0: {"momentum_buffer": momentum}, 1: {"momentum_buffer": None}},
            "param_groups": [{"lr": 0.1, "momentum": 0.9, "foreach": None, "params": [0, 1]}],
        },
        generator_state=SecureRandom.from_seed(5).get_state(),
    )
    save_training_state(tmp_path / "c.safetensors", state)
    loaded = load_training_state(tmp_path / "c.safetensors")
    assert loaded.step == 17
    assert loaded.model_state.keys() == state.model_state.keys()
    assert all(torch.equal(loaded.model_state[k], v) for k, v in state.model_state.items())
    assert torch.equal(loaded.optimizer_state["state"][0]["momentum_buffer"], momentum)
    assert loaded.optimizer_state["state"][1] == {"momentum_buffer": None}
    assert loaded.optimizer_state["param_groups"] == state.optimizer_state["param_groups"]
    assert torch.equal(loaded.generator_state, state.generator_state)
    with pytest.raises(ValueError, match="not a privtrain checkpoint"):
        load_training_state(_saved_model(tmp_path))


def _saved_model(tmp_path: Path) -> Path:
    config = _config(*ZOO[0])
    path = tmp_path / "model.safetensors"
    save_model(path, _build(config), config=config)
    return path
