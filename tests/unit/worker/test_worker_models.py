"""The model zoo: names, parameters, shapes, seeded initialisation, engine compatibility."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dp.per_example.per_sample import check_supported
from privtrain_common.zoo.architectures import MODEL_REGISTRY, build_model, register_model

# (name, params, input_shape, n_outputs) — one representative configuration per zoo entry.
ZOO_CASES: list[tuple[str, dict[str, object], tuple[int, ...], int]] = [
    ("logistic-regression", {}, (7,), 3),
    ("linear-regression", {}, (2, 3), 1),
    ("mlp", {"hidden_sizes": [8, 4], "activation": "relu"}, (5,), 2),
    ("cnn2-gn", {"groups": 4, "image_shape": None}, (1, 28, 28), 10),
    ("cnn2-gn", {"groups": 2, "image_shape": [2, 16, 14]}, (2 * 16 * 14,), 3),
]


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_registry_holds_exactly_the_documented_models() -> None:
    assert set(MODEL_REGISTRY) == {
        "logistic-regression",
        "linear-regression",
        "mlp",
        "cnn2-gn",
        *("wrn", "resnet-gn", "cnn", "vit"),  # the image zoo: tests/unit/test_model_catalogue_zoo.py
        *("transformer-classifier", "transformer-lm"),  # text: tests/unit/test_model_catalogue_text.py
        "hf",  # Transformers from a config: tests/unit/worker/test_worker_hf_models.py
    }


def test_register_model_refuses_a_duplicate_name() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_model("mlp")(MODEL_REGISTRY["mlp"])


@pytest.mark.parametrize(("name", "params", "input_shape", "n_outputs"), ZOO_CASES)
def test_output_shape_and_engine_support(
    name: str, params: dict[str, object], input_shape: tuple[int, ...], n_outputs: int
) -> None:
    model = build_model(name, params, input_shape=input_shape, n_outputs=n_outputs, generator=_seeded(0))
    check_supported(model)  # only layers the per-sample engine handles; no BatchNorm
    out = model(torch.randn(5, *input_shape))
    assert out.shape == (5, n_outputs)


def test_logistic_regression_is_one_linear_layer() -> None:
    model = build_model("logistic-regression", {}, input_shape=(2, 3), n_outputs=4)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 1
    assert linears[0].weight.shape == (4, 6) and linears[0].bias is not None


def test_linear_regression_keeps_a_column_output_and_needs_one_output() -> None:
    model = build_model("linear-regression", {}, input_shape=(4,), n_outputs=1)
    assert model(torch.zeros(3, 4)).shape == (3, 1)
    with pytest.raises(ValueError, match="one output"):
        build_model("linear-regression", {}, input_shape=(4,), n_outputs=2)


def test_mlp_defaults_and_layer_stack() -> None:
    default = build_model("mlp", {}, input_shape=(5,), n_outputs=2)
    assert [type(m) for m in default] == [nn.Flatten, nn.Linear, nn.Tanh, nn.Linear]
    assert default[1].out_features == 128
    relu = build_model("mlp", {"hidden_sizes": [8, 4], "activation": "relu"}, input_shape=(5,), n_outputs=2)
    assert [type(m) for m in relu] == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [m.out_features for m in relu if isinstance(m, nn.Linear)] == [8, 4, 2]


@pytest.mark.parametrize(
    ("name", "params", "input_shape", "n_outputs", "message"),
    [
        ("nope", {}, (3,), 2, "unknown model"),
        ("logistic-regression", {"hidden_sizes": [3]}, (3,), 2, "unknown parameter"),
        ("mlp", {"hidden_size": [3]}, (3,), 2, "unknown parameter"),
        ("mlp", {"hidden_sizes": []}, (3,), 2, "non-empty"),
        ("mlp", {"hidden_sizes": [0]}, (3,), 2, "positive integer"),
        ("mlp", {"hidden_sizes": [True]}, (3,), 2, "positive integer"),
        ("mlp", {"hidden_sizes": 8}, (3,), 2, "non-empty list"),
        ("mlp", {"activation": "sigmoid"}, (3,), 2, "activation"),
        ("mlp", {}, (3,), 0, "n_outputs"),
        ("mlp", {}, (), 2, "input_shape"),
        ("mlp", {}, (3, 0), 2, "input_shape"),
        ("cnn2-gn", {"groups": 3}, (1, 28, 28), 10, "divide"),
        ("cnn2-gn", {"groups": 32}, (1, 28, 28), 10, "divide"),
        ("cnn2-gn", {"groups": 0}, (1, 28, 28), 10, "positive integer"),
        ("cnn2-gn", {}, (784,), 10, "needs image_shape"),
        ("cnn2-gn", {"image_shape": [1, 28, 27]}, (784,), 10, "features"),
        ("cnn2-gn", {"image_shape": [1, 28]}, (784,), 10, r"\[C, H, W\]"),
        ("cnn2-gn", {"image_shape": [3, 28, 28]}, (1, 28, 28), 10, "contradicts"),
        ("cnn2-gn", {}, (28, 28), 10, r"\(C, H, W\)"),
        ("cnn2-gn", {}, (1, 13, 28), 10, "too small"),
    ],
)
def test_invalid_configurations_raise_value_error(
    name: str,
    params: dict[str, object],
    input_shape: tuple[int, ...],
    n_outputs: int,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(name, params, input_shape=input_shape, n_outputs=n_outputs)


def test_cnn2_flatten_size_for_mnist_is_512() -> None:
    model = build_model("cnn2-gn", {}, input_shape=(1, 28, 28), n_outputs=10)
    first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert first_linear.in_features == 512
    assert sum(isinstance(m, nn.GroupNorm) and m.num_groups == 4 for m in model.modules()) == 2


def _api_formula(size: int) -> int:
    """The formula the API's torch-free copy implements (copied from the brief, not the code)."""
    h1 = (size + 6 - 8) // 2 + 1
    h1p = h1 - 1
    h2 = (h1p - 4) // 2 + 1
    return h2 - 1


def _torch_feature_side(size: int) -> int | None:
    """Independent oracle: the real conv/pool stack's output height for input height `size`.

    Height and width pass through the stack independently, so one side at a time suffices (the
    width is fixed at a valid 20). None if PyTorch refuses the input or gives an empty output.
    """
    stack = nn.Sequential(
        nn.Conv2d(1, 1, kernel_size=8, stride=2, padding=3),
        nn.MaxPool2d(2, stride=1),
        nn.Conv2d(1, 1, kernel_size=4, stride=2),
        nn.MaxPool2d(2, stride=1),
    )
    try:
        with torch.no_grad():
            out = stack(torch.zeros(1, 1, size, 20))
    except RuntimeError:
        return None
    return int(out.shape[-2]) if out.shape[-2] >= 1 else None


def test_cnn2_builds_iff_the_api_formula_says_the_input_is_large_enough() -> None:
    """Pins the formula the API's copy uses to real PyTorch arithmetic for H, W in 1..39."""
    for size in range(1, 40):
        oracle = _torch_feature_side(size)
        assert (oracle is not None) == (_api_formula(size) >= 1), size
        assert oracle is None or oracle == _api_formula(size), size
    for height in range(1, 40):
        for width in range(1, 40):
            h_out, w_out = _api_formula(height), _api_formula(width)
            if h_out < 1 or w_out < 1:
                with pytest.raises(ValueError, match="too small"):
                    build_model("cnn2-gn", {}, input_shape=(1, height, width), n_outputs=3)
                continue
            model = build_model("cnn2-gn", {}, input_shape=(1, height, width), n_outputs=3)
            first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
            assert first_linear.in_features == 32 * h_out * w_out
            if height == width:  # every new input shape costs milliseconds in oneDNN
                with torch.no_grad():
                    assert model(torch.zeros(1, 1, height, width)).shape == (1, 3)


def test_seeded_initialisation_is_reproducible_and_leaves_global_rng_alone() -> None:
    global_state = torch.get_rng_state()
    a = build_model("mlp", {"hidden_sizes": [6]}, input_shape=(4,), n_outputs=3, generator=_seeded(7))
    b = build_model("mlp", {"hidden_sizes": [6]}, input_shape=(4,), n_outputs=3, generator=_seeded(7))
    c = build_model("mlp", {"hidden_sizes": [6]}, input_shape=(4,), n_outputs=3, generator=_seeded(8))
    assert torch.equal(torch.get_rng_state(), global_state)
    for (name, pa), pb, pc in zip(
        a.state_dict().items(), b.state_dict().values(), c.state_dict().values(), strict=True
    ):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name


def test_seeded_initialisation_keeps_pytorch_default_init_distribution() -> None:
    """Default Linear init is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); seeding must not change it."""
    model = build_model("logistic-regression", {}, input_shape=(400,), n_outputs=50, generator=_seeded(1))
    weight = model[1].weight.detach()
    bound = 1 / 400**0.5
    assert weight.abs().max() <= bound
    assert abs(weight.std().item() - bound / 3**0.5) < 0.03 * bound
