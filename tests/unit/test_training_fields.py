"""Per-algorithm training fields: each algorithm reads some of training.*, refuses the others,
and full-batch algorithms record batch_size = n themselves; pricing is unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from algorithms import ALGORITHMS, MissingTrainingFields, UnusedTrainingField, get_algorithm
from algorithms.training_fields import ALL_TRAINING_FIELDS, OPTIONAL_PER_ALGORITHM_FIELDS, PER_ALGORITHM_FIELDS
from kernel.datasets.facts import DatasetFacts
from kernel.db.orm import Dataset
from kernel.errors import InvalidInput
from kernel.jobs.planning import plan_job
from kernel.schemas.jobs import JobCreate, TrainingSpec

FULL_BATCH = {"kl-spider", "adaptive-noisy-gd", "noisy-gd", "proximal-point", "ht-private-lasso"}
SINGLE_PASS = {"ht-dp-fw", "ht-sparse-linreg", "ht-sparse-opt"}
AUGMULT_READERS = {"dp-sgd", "dp-adam", "auto-s", "dp-psac", "sgd", "adam"}
N_ROWS = 600

CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "kl-spider": ("regression", {"L0": 3.0, "L1": 2.0, "gamma": 2.0, "kappa": 1.5, "F0": 1.0}, {"steps": 40}),
    "adaptive-noisy-gd": ("regression", {"L0": 3.0, "L1": 2.0}, {"steps": 40}),
    "noisy-gd": ("regression", {"L0": 3.0, "L1_tilde": 0.2}, {"epochs": 2.5}),
    "proximal-point": ("regression", {"L0": 3.0, "L1_tilde": 0.5, "max_inner_steps": 5}, {"steps": 40}),
    "ht-dp-fw": ("classification", {}, {"epochs": 1}),
    "ht-private-lasso": ("regression", {}, {"steps": 7}),
    "ht-sparse-linreg": ("regression", {}, {"epochs": 1}),
    "ht-sparse-opt": ("classification", {"sensitivity_mode": "tight"}, {"steps": 5}),
}

# (σ, steps, ledger ε) that the same jobs were priced at when their specs still had to carry
# batch_size (n, or 1 for the block algorithms) and learning_rate: leaving them out changes nothing.
PRICED_BEFORE: dict[str, tuple[float, int, float]] = {
    "kl-spider/all": (2.456942372258315, 1000, 1.9999995159353938),
    "kl-spider/holdout": (3.111684414995661, 1000, 1.99999893590574),
    "adaptive-noisy-gd/all": (2.456942372258315, 1000, 1.9999995159353938),
    "adaptive-noisy-gd/holdout": (3.111684414995661, 1000, 1.99999893590574),
    "noisy-gd/all": (4.255549502265177, 3, 1.9999992906654032),
    "noisy-gd/holdout": (5.389596114649479, 3, 1.9999987486475042),
    "proximal-point/all": (2.456942372258315, 1000, 1.9999995159353938),
    "proximal-point/holdout": (3.111684414995661, 1000, 1.99999893590574),
    "ht-dp-fw/all": (0.5079335450155062, 5, 1.9999984880780601),
    "ht-dp-fw/holdout": (0.6795910629420684, 5, 1.9999995932790025),
    "ht-private-lasso/all": (3.250229733286125, 7, 1.9999992211499176),
    "ht-private-lasso/holdout": (4.116372170717978, 7, 1.9999986908619674),
    "ht-sparse-linreg/all": (15.031059691611304, 7, 1.9999986946762394),
    "ht-sparse-linreg/holdout": (20.018963806239515, 7, 1.9999999338804295),
    "ht-sparse-opt/all": (15.031059691611304, 5, 1.9999986946762394),
    "ht-sparse-opt/holdout": (20.018963806239515, 5, 1.9999999338804295),
}


def _spec(name: str, *, holdout: bool = False, **extra_training: Any) -> tuple[JobCreate, Dataset]:
    task, hyper, training = CASES[name]
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[20], task=task, n_classes=2 if task == "classification" else None)
    evaluation = None
    if holdout:
        evaluation = {
            "holdout_fraction": 0.2,
            "mechanism": "laplace",
            "epsilon": 0.5,
            **({"error_clip": 4.0} if task == "regression" else {}),
        }
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression" if task == "classification" else "linear-regression"},
            "algorithm": {"name": name, "hyperparameters": hyper},
            "privacy": {"target_epsilon": 2.0},
            "training": {**training, **extra_training},
            "evaluation": evaluation,
        }
    )
    return spec, dataset


def _plan(spec: JobCreate, dataset: Dataset) -> Any:
    return plan_job(spec, dataset, dataset_delta=1e-5, max_steps=1_000_000)


@pytest.mark.parametrize("key", sorted(PRICED_BEFORE))
def test_leaving_the_unused_fields_out_prices_the_job_as_before(key: str) -> None:
    name, rows = key.split("/")
    job = _plan(*_spec(name, holdout=rows == "holdout"))
    sigma, steps, epsilon = PRICED_BEFORE[key]
    assert job.noise_multiplier == pytest.approx(sigma, rel=1e-9)
    assert job.plan.steps == steps
    assert job.epsilon_ledger == pytest.approx(epsilon, rel=1e-9)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_stored_spec_records_n_for_full_batch_and_nothing_for_single_pass(name: str) -> None:
    job = _plan(*_spec(name))
    assert job.spec["training"]["learning_rate"] is None
    assert job.spec["training"]["batch_size"] == (N_ROWS if name in FULL_BATCH else None)
    assert job.training.batch_size == job.spec["training"]["batch_size"]
    assert job.hyperparameters == get_algorithm(name).validate_hyperparameters(job.spec["algorithm"]["hyperparameters"])


@pytest.mark.parametrize(
    ("name", "field", "reason"),
    [
        ("kl-spider", "batch_size", "kl-spider is full-batch"),
        ("noisy-gd", "learning_rate", "noisy-gd takes its step sizes from the paper's schedule"),
        ("ht-private-lasso", "batch_size", "ht-private-lasso is full-batch"),
        ("ht-dp-fw", "batch_size", "ht-dp-fw is single-pass over disjoint blocks of n_train/T rows"),
        ("ht-sparse-opt", "learning_rate", "ht-sparse-opt takes its step sizes from its hyperparameters"),
    ],
)
def test_an_unused_field_is_refused_with_what_to_do(name: str, field: str, reason: str) -> None:
    value = N_ROWS if field == "batch_size" else 1.0  # even the value the old specs had to repeat
    with pytest.raises(InvalidInput) as caught:
        _plan(*_spec(name, **{field: value}))
    assert caught.value.slug == "invalid-job-spec"
    assert caught.value.detail == f"training.{field}: {reason} and does not use it; leave it out"


@pytest.mark.parametrize("missing", [("batch_size",), ("learning_rate",), ("batch_size", "learning_rate")])
def test_a_missing_field_of_an_algorithm_that_reads_it_is_the_old_validation_error(missing: tuple[str, ...]) -> None:
    training = {k: v for k, v in {"batch_size": 32, "learning_rate": 0.5}.items() if k not in missing}
    spec = JobCreate.model_validate(
        {
            "dataset_id": "ds_x",
            "model": {"name": "logistic-regression"},
            "algorithm": {"name": "dp-sgd"},
            "privacy": {"target_epsilon": 2.0},
            "training": {"steps": 10, **training},
        }
    )
    dataset = Dataset(n_rows=N_ROWS, feature_shape=[20], task="classification", n_classes=2)
    with pytest.raises(InvalidInput) as caught:
        _plan(spec, dataset)
    problem = caught.value
    assert problem.slug == "validation-error"
    assert problem.detail == f"body.training.{missing[0]}: Field required"
    assert problem.extra["errors"] == [
        {"loc": ["body", "training", field], "msg": "Field required", "type": "missing"} for field in missing
    ]


def test_accept_training_fills_n_refuses_unused_and_requires_read_fields() -> None:
    facts = DatasetFacts(n_rows=123, feature_shape=(4,), task="regression", n_classes=None)
    accepted = get_algorithm("noisy-gd").accept_training(TrainingSpec(steps=3), facts)
    assert accepted.batch_size == 123 and accepted.learning_rate is None and accepted.steps == 3
    assert get_algorithm("ht-dp-fw").accept_training(TrainingSpec(epochs=1), facts).batch_size is None
    with pytest.raises(UnusedTrainingField):
        get_algorithm("noisy-gd").accept_training(TrainingSpec(steps=3, learning_rate=0.1), facts)
    with pytest.raises(MissingTrainingFields) as missing:
        get_algorithm("dicesgd").accept_training(TrainingSpec(steps=3, batch_size=4), facts)
    assert missing.value.fields == ("learning_rate",)
    given = TrainingSpec(steps=3, batch_size=4, learning_rate=0.1)
    assert get_algorithm("dicesgd").accept_training(given, facts) == given


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_describe_lists_the_training_fields(name: str) -> None:
    algorithm = get_algorithm(name)
    described = algorithm.describe()
    unused = ALL_TRAINING_FIELDS - algorithm.training_fields
    assert described["training_fields"] == sorted(algorithm.training_fields)
    assert set(described["training_schema"]["properties"]) == algorithm.training_fields
    assert described["full_batch"] == (name in FULL_BATCH)
    if name in FULL_BATCH | SINGLE_PASS:  # the KL family's full batch may be over privacy units
        per_unit = {"rows_per_unit"} if algorithm.privacy_units else set()
        assert unused == set(PER_ALGORITHM_FIELDS + OPTIONAL_PER_ALGORITHM_FIELDS) - per_unit
        assert set(algorithm.unused_training_reasons) == unused
    elif name in AUGMULT_READERS:
        assert not unused
        assert {"batch_size", "learning_rate"} <= set(described["training_schema"]["required"])
    else:  # per-step algorithms with their own aggregator: per privacy unit where it makes sense
        expected = {"augmult", "precision"} | ({"rows_per_unit"} if not algorithm.privacy_units else set())
        assert unused == expected
        assert set(algorithm.unused_training_reasons) >= unused
        assert {"batch_size", "learning_rate"} <= set(described["training_schema"]["required"])
