"""A job's Idempotency-Key digest must not change when the spec gains optional fields: a client
retrying a submission across a server upgrade would otherwise be refused as a reused key."""

from __future__ import annotations

from kernel.jobs.planning import request_hash
from kernel.schemas.jobs import JobCreate

SPEC = {
    "dataset_id": "ds_0123456789abcdef01234567",
    "model": {"name": "logistic-regression"},
    "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
    "privacy": {"target_epsilon": 4},
    "training": {"epochs": 20, "batch_size": 128, "learning_rate": 2.0},
}
DIGEST_BEFORE_THE_NEW_FIELDS = "146dce45ad7215edce54cc3b2ee66c60e8495f004f61d9b5c92e5ca64119250c"
"""request_hash(SPEC) as computed by the service before model.init, training.finetune and
training.ema_decay existed."""


def test_a_spec_without_the_new_fields_keeps_its_digest() -> None:
    assert request_hash(JobCreate.model_validate(SPEC)) == DIGEST_BEFORE_THE_NEW_FIELDS


def test_the_new_fields_change_the_digest_when_set() -> None:
    with_finetune = SPEC | {"training": SPEC["training"] | {"finetune": "full"}}
    with_ema = SPEC | {"training": SPEC["training"] | {"ema_decay": 0.999}}
    with_init = SPEC | {"model": {"name": "logistic-regression", "init": {"job_id": "job_0123456789abcdef01234567"}}}
    digests = {request_hash(JobCreate.model_validate(spec)) for spec in (SPEC, with_finetune, with_ema, with_init)}
    assert len(digests) == 4
