"""The client's typed objects carry every field the API answers with: each resource is compared
with the response schema of the service's OpenAPI document (deprecated aliases aside)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import privtrain
from api.main import create_app
from privtrain import resources
from tests.conftest import make_settings

RESOURCE_SCHEMAS = {
    resources.BaseModel: "BaseModelOut",
    resources.Budget: "BudgetOut",
    resources.Dataset: "DatasetOut",
    resources.Deletion: "DeletionOut",
    resources.Grant: "GrantOut",
    resources.Invitation: "InvitationOut",
    resources.Job: "JobOut",
    resources.JobEvent: "JobEventOut",
    resources.LedgerEntry: "LedgerEntryOut",
    resources.Tokenizer: "TokenizerOut",
    resources.TuningJob: "TuningOut",
    resources.Estimate: "PrivacyEstimate",
}


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    settings = make_settings(Path(tmp_path_factory.mktemp("openapi")))
    return dict(create_app(settings).openapi()["components"]["schemas"])


@pytest.mark.parametrize("resource", list(RESOURCE_SCHEMAS), ids=lambda r: r.__name__)
def test_every_field_of_the_response_schema_is_a_field_of_the_typed_object(
    resource: type[resources.Resource], schemas: dict[str, Any]
) -> None:
    fields = {f.name for f in dataclasses.fields(resource)}
    properties = schemas[RESOURCE_SCHEMAS[resource]]["properties"]
    missing = sorted(name for name, schema in properties.items() if name not in fields and not schema.get("deprecated"))
    assert not missing, f"{resource.__name__} lacks {missing}"


def test_a_job_carries_its_epsilon_on_the_basis_the_server_states() -> None:
    job = resources.Job.from_api(
        {
            "id": "job_1",
            "status": "succeeded",
            "epsilon": 0.8,
            "epsilon_basis": "committed",
            "epsilon_reserved": 1.0,
            "epsilon_committed": 0.8,
            "links": {"self": "/v1/jobs/job_1"},
        }
    )
    assert (job.epsilon, job.epsilon_basis, job.epsilon_committed) == (0.8, "committed", 0.8)
    assert job.links == {"self": "/v1/jobs/job_1"}


def test_load_model_is_listed_in_the_package() -> None:
    assert {"load_model", "LoadedModel"} <= set(dir(privtrain))


def test_a_loaded_model_is_callable_on_arrays_and_tensors(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from privtrain_common.model_files import save_model
    from privtrain_common.zoo.architectures import build_model

    model = build_model("mlp", {"hidden_sizes": [4]}, input_shape=(3,), n_outputs=2)
    config = {"format_version": 1, "model": {"name": "mlp", "params": {"hidden_sizes": [4]}}}
    save_model(
        tmp_path / "m.safetensors",
        model,
        config={**config, "input_shape": [3], "n_outputs": 2, "task": "classification"},
    )
    loaded = privtrain.load_model(tmp_path / "m.safetensors")
    X = np.random.default_rng(0).normal(size=(5, 3))  # float64: cast to the model's float32
    out = loaded(X)
    assert out.shape == (5, 2) and not out.requires_grad
    torch.testing.assert_close(out, loaded.model(torch.as_tensor(X, dtype=torch.float32)))


def test_one_naming_rule_and_the_former_names_still_work_with_a_warning() -> None:
    """get_<thing>(id), list_<things>(), iter_<things>(); each former name calls the new method."""
    from privtrain.former_names import FORMER_NAMES

    calls: list[tuple[str, tuple[object, ...]]] = []

    class Recording(privtrain.Client):
        def __init__(self) -> None:  # no connection: only the names are tested
            pass

    for current in set(FORMER_NAMES.values()):
        setattr(Recording, current, lambda self, *args, _name=current: calls.append((_name, args)) or _name)
    client = Recording()
    for former, current in FORMER_NAMES.items():
        with pytest.warns(DeprecationWarning, match=f"use Client.{current}"):
            assert getattr(client, former)("x") == current
    assert calls == [(current, ("x",)) for current in FORMER_NAMES.values()]
    public = [name for name in dir(privtrain.Client) if not name.startswith("_") and name not in FORMER_NAMES]
    readers = [name for name in public if not name.startswith(("get_", "list_", "iter_"))]
    verbs = {"accept_invitation", "cancel", "cancel_tuning", "close", "create_tuning", "decline_invitation"}
    verbs |= {"delete_base_model", "delete_dataset", "download_model", "estimate", "estimate_tuning", "from_env"}
    verbs |= {"generate", "grant", "raise_budget", "revoke_grant", "stream_events", "submit", "train_tokenizer"}
    verbs |= {"upload_base_model", "upload_dataset", "upload_hf_base_model", "upload_tokenizer", "wait", "wait_tuning"}
    assert set(readers) <= verbs, sorted(set(readers) - verbs)
