"""Errors that help: a typo gets 'did you mean …?', a body that is not JSON says where it breaks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import dp_sgd_spec

Mutation = Callable[[dict[str, Any]], None]


def _problem(client: TestClient, spec: dict[str, Any] | None = None, *, content: bytes | None = None) -> dict[str, Any]:
    if content is not None:
        response = client.post("/v1/jobs/estimate", content=content, headers={"Content-Type": "application/json"})
    else:
        response = client.post("/v1/jobs/estimate", json=spec)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


@pytest.mark.parametrize(
    ("mutate", "slug", "detail"),
    [
        (
            lambda s: s["algorithm"].update(name="dp-adma"),
            "unknown-algorithm",
            "unknown algorithm 'dp-adma'; did you mean 'dp-adam'?",
        ),
        (
            lambda s: s["model"].update(name="logistic-regresion"),
            "unknown-model",
            "unknown model 'logistic-regresion'; did you mean 'logistic-regression'?",
        ),
        (
            lambda s: s["model"].update(name="bert-1000"),
            "unknown-model",
            "unknown model 'bert-1000'; expected one of: 'cnn', 'cnn2-gn', 'hf', 'linear-regression', "
            "'logistic-regression', 'mlp', 'resnet-gn', 'transformer-classifier', 'transformer-lm', 'vit', 'wrn'",
        ),
        (
            lambda s: s["algorithm"]["hyperparameters"].update(clipping_nrom=1.0),
            "invalid-job-spec",
            "algorithm.hyperparameters.clipping_nrom: unknown field; did you mean 'clipping_norm'?",
        ),
        (
            lambda s: s["algorithm"]["hyperparameters"].update(clip=1.0),
            "invalid-job-spec",
            "algorithm.hyperparameters.clip: unknown field; expected one of: 'clipping_norm', 'momentum', "
            "'weight_decay'",
        ),
        (
            lambda s: s["model"].update(name="mlp", params={"hidden_size": [32]}),
            "model-incompatible",
            "model.params.hidden_size: unknown field; did you mean 'hidden_sizes'?",
        ),
        (
            lambda s: s["model"].update(params={"hidden_sizes": [32]}),
            "model-incompatible",
            "model.params.hidden_sizes: unknown field; no fields are accepted here",
        ),
        (
            lambda s: s.update(privacy={"epsilon": 4.0}),
            "validation-error",
            "body.privacy.epsilon: unknown field; did you mean 'target_epsilon'?",
        ),
        (
            lambda s: s.update(trainig=s.pop("training")),
            "validation-error",
            "body.trainig: unknown field; did you mean 'training'?",
        ),
        (
            lambda s: s.update(evaluation={"holdout_fraction": 0.2, "epsilom": 0.5}),
            "validation-error",
            "body.evaluation.epsilom: unknown field; did you mean 'epsilon'?",
        ),
    ],
)
def test_typos_get_suggestions(alice: TestClient, dataset_id: str, mutate: Mutation, slug: str, detail: str) -> None:
    spec = dp_sgd_spec(dataset_id)
    mutate(spec)
    problem = _problem(alice, spec)
    assert problem["type"] == f"/problems/{slug}"
    assert problem["detail"] == detail


def test_a_typo_is_reported_instead_of_the_field_it_left_missing(alice: TestClient, dataset_id: str) -> None:
    spec = dp_sgd_spec(dataset_id)
    spec["trainig"] = spec.pop("training")
    problem = _problem(alice, spec)
    by_type = {error["type"]: error for error in problem["errors"]}
    assert set(by_type) == {"missing", "extra_forbidden"}  # both are still listed
    assert by_type["extra_forbidden"]["msg"] == "unknown field; did you mean 'training'?"


def test_a_submit_gets_the_same_suggestions(alice: TestClient, dataset_id: str) -> None:
    spec = dp_sgd_spec(dataset_id)
    spec["algorithm"]["name"] = "dp-adma"
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422
    assert response.json()["detail"] == "unknown algorithm 'dp-adma'; did you mean 'dp-adam'?"


BROKEN_BODY = b'{\n  "dataset_id": "ds_x",\n  "model": {"name": "mlp"} "algorithm": {}\n}'


def test_a_body_that_is_not_json_names_the_place_in_words(alice: TestClient) -> None:
    problem = _problem(alice, content=BROKEN_BODY)
    assert problem["type"] == "/problems/validation-error"
    assert problem["detail"] == (
        "the request body is not valid JSON: expected ',' or '}' at line 3, column 28 (character 53)"
    )
    assert problem["position"] == {"line": 3, "column": 28, "character": 53}
    assert BROKEN_BODY.decode()[53:64] == '"algorithm"'  # the offset points at the stray member


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"a": [1, 2 3]}', "expected ',' or ']' at line 1, column 13 (character 12)"),
        (b'{"a": 1,}', "a trailing comma before '}' (JSON allows none) at line 1, column 9 (character 8)"),
        (b"{'a': 1}", "expected a field name in double quotes at line 1, column 2 (character 1)"),
        (b'{"a": 1} extra', "unexpected text after the end of the JSON value at line 1, column 10 (character 9)"),
        (b'{"a": "open', "a string that is never closed starts at line 1, column 7 (character 6)"),
    ],
)
def test_common_json_mistakes_are_named(alice: TestClient, body: bytes, detail: str) -> None:
    assert _problem(alice, content=body)["detail"] == f"the request body is not valid JSON: {detail}"


def test_other_validation_errors_keep_pydantics_words(alice: TestClient, dataset_id: str) -> None:
    spec = dp_sgd_spec(dataset_id)
    spec["training"]["batch_size"] = 0
    problem = _problem(alice, spec)
    assert problem["detail"] == "body.training.batch_size: Input should be greater than or equal to 1"
