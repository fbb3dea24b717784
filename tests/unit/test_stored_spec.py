"""The typed view of stored specs reads rows written by earlier releases (which lack newer fields,
and may hold values outside today's request ranges) and gives each back unchanged; it refuses a
shape the service never wrote, and is parsed once per job object and spec dict.

The shapes the service writes now are made through the API in tests/api/test_api_stored_spec.py;
these are the older ones, as the release that wrote them stored them (no migration rewrote specs).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import ValidationError

from kernel.db.orm import Job
from kernel.schemas.stored_spec import BaseModelStart, JobStart, StoredJobSpec, parse_stored_spec, stored_spec

FIRST_RELEASE: dict[str, Any] = {
    "dataset_id": "ds_1",
    "model": {"name": "mlp", "params": {"hidden_sizes": [8]}},
    "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
    "privacy": {"target_epsilon": None, "noise_multiplier": 1e-4, "delta": 1e-5},  # σ below today's minimum
    "training": {"epochs": None, "steps": 10, "batch_size": 64, "learning_rate": 0.5},
}
"""A spec of the service's first release: no evaluation, resources, init or the later training fields."""

WITH_EVALUATION: dict[str, Any] = {
    **FIRST_RELEASE,
    "training": {**FIRST_RELEASE["training"], "time_limit_s": None},
    "evaluation": {
        "holdout_fraction": 0.2,
        "mechanism": "laplace",
        "epsilon": 0.5,
        "noise_multiplier": None,
        "error_clip": None,
    },  # before text datasets: no loss_clip
}

FIRST_BASE_MODEL_START: dict[str, Any] = {
    "kind": "base-model",
    "base_model_id": "bm_1",
    "name": "tiny",
    "source": None,
    "sha256": "a" * 64,
    "architecture": "mlp",
    "n_outputs": 10,
}
"""Before stored dtypes and reused heads."""

FIRST_JOB_START: dict[str, Any] = {
    "kind": "job",
    "job_id": "job_1",
    "dataset_id": "ds_0",
    "dataset_public": False,
    "sha256": "b" * 64,
    "architecture": "mlp",
    "n_outputs": 10,
    "epsilon": 1.5,
    "delta": 1e-5,
}
"""Before class lists, reused heads and init chains."""

TUNING_BEFORE_SLOTS: dict[str, Any] = {
    "search_space": {"training.learning_rate": [0.1, 1.0], "training.steps": {"low": 5.0, "high": 20.0, "log": False}},
    "trials": {"distribution": "poisson", "parameters": {"mean": 2.0}, "mean": 2.0},  # no public maximum
    "selection": {"metric": "accuracy", "goal": "max"},
    "epsilon_one_trial": 0.8,
    "epsilon_separate_jobs": 1.6,
    "candidates": [
        {
            "assignment": {"training.learning_rate": 0.1, "training.steps": 7},
            "spec": WITH_EVALUATION,
            "noise_multiplier": 1.2,
            "sampling_probability": 0.05,
            "steps": 7,
            "epsilon_ledger": 0.8,
        }
    ],
    "selected": {"training.learning_rate": 0.1, "training.steps": 7},
}
"""A succeeded tuning admitted before slots existed: no schedule, no maximum of K."""

OLDER_ROWS: dict[str, dict[str, Any]] = {
    "first release": FIRST_RELEASE,
    "with evaluation": WITH_EVALUATION,
    "non-private": {**WITH_EVALUATION, "privacy": None},
    "base-model start": {
        **WITH_EVALUATION,
        "model": {**FIRST_RELEASE["model"], "init": {"base_model_id": "bm_1", "job_id": None}},
        "init": FIRST_BASE_MODEL_START,
    },
    "job start": {
        **WITH_EVALUATION,
        "model": {**FIRST_RELEASE["model"], "init": {"base_model_id": None, "job_id": "job_1"}},
        "init": FIRST_JOB_START,
    },
    "tuning before slots": {**WITH_EVALUATION, "tuning": TUNING_BEFORE_SLOTS},
}


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value)


@pytest.mark.parametrize("raw", OLDER_ROWS.values(), ids=OLDER_ROWS.keys())
def test_older_rows_parse_and_come_back_unchanged(raw: dict[str, Any]) -> None:
    view = parse_stored_spec(raw)
    assert _json(view.to_json()) == _json(raw)


def test_the_view_types_what_older_rows_lack() -> None:
    first = parse_stored_spec(FIRST_RELEASE)
    assert first.evaluation is None and first.resources is None and first.init is None and first.tuning is None
    assert first.training.precision is None and first.model.init is None
    assert first.privacy is not None and first.privacy.noise_multiplier == 1e-4
    base = parse_stored_spec(OLDER_ROWS["base-model start"]).init
    assert isinstance(base, BaseModelStart) and base.stored_dtypes is None and base.new_head is None
    job = parse_stored_spec(OLDER_ROWS["job start"]).init
    assert isinstance(job, JobStart) and job.chain is None and job.classes is None
    tuning = parse_stored_spec(OLDER_ROWS["tuning before slots"]).tuning
    assert tuning is not None and tuning.schedule is None and tuning.trials.maximum is None
    assert tuning.search_space_json() == TUNING_BEFORE_SLOTS["search_space"]
    assert tuning.public_candidates() == [
        {key: value for key, value in TUNING_BEFORE_SLOTS["candidates"][0].items() if key != "spec"}
    ]


@pytest.mark.parametrize(
    "change",
    [
        lambda spec: spec.update(unknown=1),
        lambda spec: spec["training"].update(epoch=3),  # a typo the service never wrote
        lambda spec: spec.pop("training"),
        lambda spec: spec.update(init={**FIRST_JOB_START, "kind": "checkpoint"}),
        lambda spec: spec["model"].update(params=[8]),
    ],
)
def test_a_shape_the_service_never_wrote_is_refused(change: Any) -> None:
    raw = copy.deepcopy(WITH_EVALUATION)
    change(raw)
    with pytest.raises(ValidationError):
        parse_stored_spec(raw)


def test_a_job_row_is_parsed_once_per_spec_dict() -> None:
    job = Job(spec=copy.deepcopy(FIRST_RELEASE))
    first = stored_spec(job)
    assert stored_spec(job) is first
    job.spec = copy.deepcopy(OLDER_ROWS["tuning before slots"])  # a tuning that succeeded: assigned anew
    again = stored_spec(job)
    assert again is not first and again.is_tuning


def test_a_frozen_holder_is_parsed_once_too() -> None:
    @dataclass(frozen=True)
    class Plan:
        spec: dict[str, Any]

    plan = Plan(spec=copy.deepcopy(WITH_EVALUATION))
    assert stored_spec(plan) is stored_spec(plan)


def test_the_view_is_read_only() -> None:
    view: StoredJobSpec = parse_stored_spec(FIRST_RELEASE)
    with pytest.raises(ValidationError):
        view.dataset_id = "ds_2"  # type: ignore[misc]


def test_a_released_trial_is_its_candidate_with_the_tuning_and_its_assignment() -> None:
    carrier = parse_stored_spec({**WITH_EVALUATION, "tuning": {**TUNING_BEFORE_SLOTS, "selected": None}})
    assert carrier.tuning is not None
    candidate = carrier.tuning.candidates[0]
    released = carrier.released_trial(candidate).to_json()
    assert released == {**WITH_EVALUATION, "tuning": {**TUNING_BEFORE_SLOTS, "selected": candidate.assignment}}
    with pytest.raises(ValueError, match="only a tuning"):
        parse_stored_spec(WITH_EVALUATION).released_trial(candidate)
