"""The text models in the torch-free catalogue and at submission.

Sizes and fine-tuning blocks equal the modules the worker builds; vocab_size and pad_id come from
the dataset (a different given value is a 422); the submission refuses what does not fit a
language-model dataset (KL-family and heavy-tailed algorithms, an evaluation, token_loss elsewhere,
LoRA on a model without attention).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from kernel.datasets.facts import DatasetFacts
from kernel.datasets.stored_facts import facts_of
from kernel.db.orm import Dataset
from kernel.errors import InvalidInput
from kernel.jobs.planning import plan_job
from kernel.model_catalogue import ModelIncompatible, get_model
from kernel.schemas.jobs import JobCreate
from privtrain_common.zoo.architectures import SelfAttention, TransformerBlock, build_model
from training.finetune import block_members, block_names

VOCAB, PAD = 50, 3


def _facts(task: str, length: int = 12, n_classes: int | None = 4) -> DatasetFacts:
    return DatasetFacts(
        n_rows=200,
        feature_shape=(length,),
        task=task,
        n_classes=n_classes if task == "classification" else None,
        vocab_size=VOCAB,
        pad_id=PAD,
    )


CASES: list[tuple[str, dict[str, Any], DatasetFacts]] = [
    ("transformer-classifier", {}, _facts("classification")),
    (
        "transformer-classifier",
        {"layers": 1, "dim": 6, "heads": 3, "mlp_dim": 5, "pooling": "first"},
        _facts("classification", 7, 2),
    ),
    ("transformer-lm", {"layers": 3, "dim": 8, "heads": 2, "mlp_dim": 16}, _facts("language-model", 9)),
    ("transformer-lm", {"vocab_size": VOCAB, "pad_id": PAD, "dim": 4, "heads": 1}, _facts("language-model", 5)),
]


def _built(name: str, params: dict[str, Any], facts: DatasetFacts) -> nn.Module:
    return build_model(name, params, input_shape=facts.feature_shape, n_outputs=get_model(name).n_outputs(facts))


def _hooked_activations(model: nn.Module, facts: DatasetFacts) -> int:
    """The input and every layer's output, residual sums and attention's scores and softmax."""
    produced: list[int] = []

    def leaf(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        produced.append(output[0].numel())

    def block(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        produced.append(2 * output[0].numel())

    def attention(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        assert isinstance(module, SelfAttention)
        produced.append(2 * module.heads * output.shape[1] ** 2 + output[0].numel())

    for module in model.modules():
        if not list(module.children()):
            module.register_forward_hook(leaf)
        elif isinstance(module, TransformerBlock):
            module.register_forward_hook(block)
        elif isinstance(module, SelfAttention):
            module.register_forward_hook(attention)
    with torch.no_grad():
        model(torch.full((1, *facts.feature_shape), PAD + 1))
    return facts.n_features + sum(produced)


@pytest.mark.parametrize(("name", "params", "facts"), CASES)
def test_catalogue_sizes_and_blocks_equal_torch(name: str, params: dict[str, Any], facts: DatasetFacts) -> None:
    definition = get_model(name)
    normalised = definition.validate(params, facts)
    assert normalised["vocab_size"] == VOCAB and normalised["pad_id"] == PAD  # filled from the dataset
    model = _built(name, normalised, facts)
    assert definition.parameter_count(normalised, facts) == sum(p.numel() for p in model.parameters())
    size = definition.size(definition.params_model.model_validate(normalised), facts, definition.n_outputs(facts))
    pooled = normalised["dim"] if name == "transformer-classifier" else 0  # the pooled vector, inside forward
    assert size.activations == _hooked_activations(model, facts) + pooled
    assert definition.block_names(normalised) == block_names(model)
    owners = [
        block
        for parameter, _ in model.named_parameters()
        for block, members in block_members(model).items()
        if any(parameter.startswith(f"{member}.") for member in members)
    ]
    assert len(owners) == len(list(model.parameters()))  # every parameter in exactly one block


def test_outputs_are_classes_or_the_vocabulary() -> None:
    assert get_model("transformer-classifier").n_outputs(_facts("classification", n_classes=4)) == 4
    assert get_model("transformer-lm").n_outputs(_facts("language-model")) == VOCAB
    model = _built(
        "transformer-lm", get_model("transformer-lm").validate({}, _facts("language-model")), _facts("language-model")
    )
    assert model(torch.zeros(2, 12, dtype=torch.int64)).shape == (2, 12, VOCAB)


@pytest.mark.parametrize(
    ("name", "params", "facts", "message"),
    [
        ("transformer-lm", {"vocab_size": VOCAB + 1}, _facts("language-model"), "tokenizer has vocab_size 50"),
        ("transformer-classifier", {"pad_id": 0}, _facts("classification"), "tokenizer has pad_id 3"),
        ("transformer-lm", {}, _facts("classification"), "supports \\['language-model'\\]"),
        ("transformer-classifier", {}, _facts("language-model"), "supports \\['classification'\\]"),
        ("transformer-classifier", {}, DatasetFacts(10, (12,), "classification", 2), "need a text dataset"),
        ("transformer-lm", {"dim": 10, "heads": 3}, _facts("language-model"), "must divide dim"),
    ],
)
def test_mismatches_are_refused(name: str, params: dict[str, Any], facts: DatasetFacts, message: str) -> None:
    with pytest.raises(ModelIncompatible, match=message):
        get_model(name).validate(params, facts)


def _text_dataset(task: str) -> Dataset:
    return Dataset(
        n_rows=200,
        feature_shape=[12],
        task=task,
        n_classes=4 if task == "classification" else None,
        modality="text",
        format="jsonl",
        vocab_size=VOCAB,
        pad_id=PAD,
        public=False,
    )


def _spec(
    model: str = "transformer-lm", algorithm: str = "dp-sgd", *, params: dict[str, Any] | None = None, **sections: Any
) -> JobCreate:
    body: dict[str, Any] = {
        "dataset_id": "ds_x",
        "model": {"name": model, "params": {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8, **(params or {})}},
        "algorithm": {"name": algorithm},
        "privacy": {"noise_multiplier": 1.0},
        "training": {"steps": 5, "batch_size": 20, "learning_rate": 0.1},
    }
    init = sections.pop("model_init", None)
    if init is not None:
        body["model"]["init"] = init
    for section, value in sections.items():
        body[section] = {**body.get(section, {}), **value}
    return JobCreate.model_validate(body)


def _plan(spec: JobCreate, task: str = "language-model") -> Any:
    return plan_job(spec, _text_dataset(task), dataset_delta=1e-5, max_steps=10_000)


def test_a_language_model_job_is_planned_with_the_dataset_vocabulary() -> None:
    plan = _plan(_spec(training={"token_loss": "sum"}))
    assert plan.spec["model"]["params"]["vocab_size"] == VOCAB
    assert plan.spec["model"]["params"]["pad_id"] == PAD
    assert plan.training.token_loss == "sum"


@pytest.mark.parametrize(
    ("spec", "task", "slug"),
    [
        (
            _spec(model="transformer-classifier", training={"token_loss": "mean"}),
            "classification",
            "token-loss-needs-language-model",
        ),
        (
            _spec(evaluation={"holdout_fraction": 0.2, "epsilon": 1.0, "error_clip": 1.0}),
            "language-model",
            "invalid-job-spec",
        ),
        (
            _spec(algorithm="noisy-gd", training={"batch_size": None, "learning_rate": None}),
            "language-model",
            "algorithm-unsupported-for-task",
        ),
        (_spec(params={"vocab_size": 7}), "language-model", "model-incompatible"),
    ],
    ids=["token-loss-on-classification", "regression-clip-on-lm", "kl-family-on-lm", "other-vocabulary"],
)
def test_submission_refuses_what_does_not_fit_the_task(spec: JobCreate, task: str, slug: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        _plan(spec, task)
    assert refused.value.slug == slug


def test_lora_is_refused_for_a_model_without_attention() -> None:
    from kernel.jobs.planning import _check_lora_fits_model

    spec = _spec(model="mlp", training={"finetune": "lora", "lora": {"rank": 2}})
    with pytest.raises(InvalidInput) as refused:
        _check_lora_fits_model(spec, get_model("mlp"))
    assert refused.value.slug == "lora-unsupported-model"
    assert "transformer-lm" in refused.value.detail and "vit" in refused.value.detail
    _check_lora_fits_model(spec, get_model("transformer-lm"))  # accepted


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"finetune": "lora"}, "lora \\(rank and alpha\\) is required"),
        ({"finetune": "full", "lora": {"rank": 2}}, "only there"),
        ({"finetune": "lora", "lora": {"rank": 0}}, "greater than or equal to 1"),
        ({"finetune": "lora", "lora": {"rank": 2, "alpha": 1, "dropout": 0.1}}, "lora dropout must be 0"),
        ({"finetune": "lora", "lora": {"rank": 2, "alpha": 1, "bias": "all"}}, "Extra inputs"),
        ({"token_loss": "median"}, "'mean' or 'sum'"),
    ],
)
def test_training_spec_validates_lora_and_token_loss(training: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _spec(training=training)


def test_uploaded_weights_are_validated_with_the_vocabulary_their_params_give() -> None:
    """A base-model upload has no dataset: its facts come from the declared params and outputs."""
    lm = get_model("transformer-lm")
    params = {"layers": 1, "dim": 8, "heads": 2, "mlp_dim": 8, "vocab_size": VOCAB, "pad_id": PAD}
    facts = lm.facts_for_weights(params, input_shape=(12,), n_outputs=VOCAB)
    assert facts.task == "language-model" and (facts.vocab_size, facts.pad_id) == (VOCAB, PAD)
    assert lm.validate(params, facts) == lm.validate({}, _facts("language-model")) | {
        "layers": 1,
        "dim": 8,
        "heads": 2,
        "mlp_dim": 8,
    }
    classifier = get_model("transformer-classifier")
    facts = classifier.facts_for_weights(params, input_shape=(12,), n_outputs=4)
    assert facts.task == "classification" and facts.n_classes == 4 and facts.vocab_size == VOCAB
    with pytest.raises(ModelIncompatible, match="need a text dataset"):  # params without a vocabulary
        classifier.validate({}, classifier.facts_for_weights({}, input_shape=(12,), n_outputs=4))
    mlp = get_model("mlp").facts_for_weights({}, input_shape=(6,), n_outputs=1)
    assert mlp.task == "regression" and mlp.vocab_size is None


def test_lora_is_refused_when_the_head_would_start_fresh() -> None:
    """LoRA keeps the head frozen: an init whose outputs mean other classes would leave it random."""
    from kernel.base_models.init import InitSource

    spec = _spec(
        model="transformer-classifier",
        model_init={"job_id": "job_base"},
        training={"finetune": "lora", "lora": {"rank": 2}},
    )
    dataset = _text_dataset("classification")
    params = get_model("transformer-classifier").validate(dict(spec.model.params), facts_of(dataset))

    def init(n_outputs: int) -> InitSource:
        provenance = {
            "kind": "job",
            "job_id": "job_base",
            "dataset_id": "ds_base",
            "dataset_public": True,
            "sha256": "0" * 64,
            "architecture": "transformer-classifier",
            "n_outputs": n_outputs,
            "epsilon": None,
            "delta": None,
            "classes": None,
        }
        return InitSource("transformer-classifier", params, (12,), provenance)

    with pytest.raises(InvalidInput) as refused:
        plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000, init=init(2))
    assert refused.value.slug == "lora-needs-the-init-head"
    plan = plan_job(spec, dataset, dataset_delta=1e-5, max_steps=10_000, init=init(4))  # same 4 outputs
    assert plan.spec["init"]["new_head"] is False and plan.training.lora is not None
