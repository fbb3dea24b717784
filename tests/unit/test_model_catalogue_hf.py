"""The `hf` model in the torch-free catalogue: what a Transformers config may hold, what the
dataset's tokenizer must fit, and sizes and blocks equal to the model Transformers builds."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.datasets.facts import DatasetFacts
from kernel.model_catalogue import ModelIncompatible, ModelSizeLimits, get_model
from privtrain_common.zoo.architectures import build_model
from tests.unit.worker.hf_fixtures import HF_CASES, hf_config
from training.finetune import block_names

VOCAB, PAD, LENGTH = 40, 3, 10
ROOMY = ModelSizeLimits(max_parameters=10**9, max_activation_bytes=10**12, physical_batch_size=8)


def _facts(task: str) -> DatasetFacts:
    return DatasetFacts(
        n_rows=100,
        feature_shape=(LENGTH,),
        task=task,
        n_classes=4 if task == "classification" else None,
        vocab_size=VOCAB,
        pad_id=PAD,
    )


def _dataset_task(task: str) -> str:
    return "language-model" if task == "causal-lm" else "classification"


def _validate(task: str, config: dict[str, Any], *, facts: DatasetFacts | None = None) -> dict[str, Any]:
    return get_model("hf").validate(
        {"task": task, "config": config}, facts or _facts(_dataset_task(task)), limits=ROOMY
    )


@pytest.mark.parametrize(("model_type", "task"), HF_CASES, ids=[f"{t}-{k}" for t, k in HF_CASES])
def test_size_and_blocks_equal_the_model_transformers_builds(model_type: str, task: str) -> None:
    facts = _facts(_dataset_task(task))
    params = _validate(task, hf_config(model_type))
    assert params["config"]["vocab_size"] == VOCAB and params["config"]["pad_token_id"] == PAD  # the dataset's
    definition = get_model("hf")
    model = build_model("hf", params, input_shape=(LENGTH,), n_outputs=definition.n_outputs(facts))
    assert definition.parameter_count(params, facts) == sum(p.numel() for p in model.parameters())
    assert definition.block_names(params) == block_names(model) == ["embedding", "layer1", "layer2", "head"]


def test_a_larger_vocabulary_than_the_datasets_is_kept() -> None:
    params = _validate("causal-lm", {**hf_config("gpt2"), "vocab_size": VOCAB + 7})
    assert params["config"]["vocab_size"] == VOCAB + 7


def test_shape_free_keys_pass_through_with_their_types_checked() -> None:
    config = {**hf_config("llama"), "rms_norm_eps": 1e-5, "initializer_range": 0, "hidden_act": "silu"}
    assert _validate("causal-lm", config)["config"]["rms_norm_eps"] == 1e-5
    with pytest.raises(ModelIncompatible, match=r"config\.rms_norm_eps has the wrong type"):
        _validate("causal-lm", {**config, "rms_norm_eps": "tiny"})


def test_the_default_is_a_small_bert_classifier() -> None:
    params = get_model("hf").validate({}, _facts("classification"), limits=ROOMY)
    assert params["task"] == "sequence-classification" and params["config"]["model_type"] == "bert"


@pytest.mark.parametrize(
    ("task", "config", "message"),
    [
        (
            "sequence-classification",
            {**hf_config("bert"), "model_type": "t5"},
            "'t5' is not supported; supported: bert, ",
        ),
        (
            "sequence-classification",
            {"hidden_size": 8},
            "None is not supported; supported: bert, convnext, distilbert, gpt2",
        ),
        ("sequence-classification", {**hf_config("bert"), "auto_map": {"AutoModel": "x.Y"}}, r"\['auto_map'\] are not"),
        ("sequence-classification", {**hf_config("bert"), "trust_remote_code": True}, "trust_remote_code"),
        ("sequence-classification", {**hf_config("gpt2"), "attn_pdrop": 0.1}, "dropout is always 0"),
        ("sequence-classification", {**hf_config("llama"), "tie_word_embeddings": True}, "never tied"),
        ("sequence-classification", {**hf_config("bert"), "padding": "x" * 20_000}, "larger than 16384 bytes"),
        ("sequence-classification", {**hf_config("bert"), "num_hidden_layers": 0}, "num_hidden_layers must be"),
        ("sequence-classification", {**hf_config("bert"), "num_attention_heads": 3}, r"heads \(3\) must divide"),
        ("sequence-classification", {**hf_config("bert"), "hidden_act": "os.system"}, "hidden_act must be one of"),
        ("causal-lm", hf_config("bert"), "'bert' serves \\['sequence-classification'\\], not 'causal-lm'"),
        ("sequence-classification", {**hf_config("bert"), "vocab_size": VOCAB - 1}, "tokenizer has 40 token ids"),
        ("sequence-classification", {**hf_config("bert"), "pad_token_id": 0}, "tokenizer pads with 3"),
        ("sequence-classification", hf_config("bert", positions=LENGTH - 1), "rows need 10 positions"),
        ("sequence-classification", hf_config("roberta", positions=LENGTH), "from pad_token_id \\+ 1"),
    ],
)
def test_refusals_say_why(task: str, config: Any, message: str) -> None:
    with pytest.raises(ModelIncompatible, match=message):
        _validate(task, config)


def test_a_config_must_be_an_object_and_the_task_must_be_the_datasets() -> None:
    with pytest.raises(ModelIncompatible, match=r"must be a JSON object|valid dictionary"):
        _validate("sequence-classification", ["bert"])  # type: ignore[arg-type]
    with pytest.raises(ModelIncompatible, match="trains on a language-model dataset"):
        _validate("causal-lm", hf_config("gpt2"), facts=_facts("classification"))


def test_a_tabular_dataset_is_refused() -> None:
    tabular = DatasetFacts(n_rows=10, feature_shape=(4,), task="classification", n_classes=2)
    with pytest.raises(ModelIncompatible, match="need a text dataset"):
        get_model("hf").validate({}, tabular, limits=ROOMY)


@pytest.mark.parametrize(("model_type", "task"), HF_CASES)
def test_lora_targets_are_checked_and_the_defaults_are_layers_transformers_builds(model_type: str, task: str) -> None:
    """Every accepted target names a layer of the model Transformers builds; unknown names are refused
    with the accepted list; a classifier's head trains with the adapters, a language model's does not."""
    hf = get_model("hf")
    params = _validate(task, hf_config(model_type))
    targets = hf.lora_targets[model_type]
    assert set(targets["default"]) <= set(targets["accepted"])
    assert hf.check_lora(params, None) is (task != "causal-lm")
    assert hf.check_lora(params, targets["accepted"]) is (task != "causal-lm")
    with pytest.raises(ModelIncompatible, match=", ".join(targets["accepted"])):
        hf.check_lora(params, ["not_a_layer"])
    built = build_model("hf", params, input_shape=(LENGTH,), n_outputs=VOCAB if task == "causal-lm" else 4)
    leaves = {name.rsplit(".", 1)[-1] for name, _ in built.named_modules()}
    assert set(targets["accepted"]) <= leaves


def test_target_modules_are_for_hf_models_only() -> None:
    params = get_model("transformer-classifier").params_model().model_dump(mode="json")
    assert get_model("transformer-classifier").check_lora(params, None) is False
    with pytest.raises(ModelIncompatible, match="leave it out"):
        get_model("transformer-classifier").check_lora(params, ["q"])
