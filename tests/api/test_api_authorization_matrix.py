"""Authorization matrix: every route of the app × every kind of caller → the expected status,
and no other tenant's data in any body.

Callers: the dataset's owner, an analyst it invited and that accepted, a tenant with no role (it
has its own dataset and job), an analyst whose grant was revoked (it keeps its own past job), no
key, a malformed Authorization header, and a deleted (revoked) key of the owner. A third tenant
holds a pending invitation to the shared dataset, which gives it nothing.

Deleting a dataset changes what every later row sees, so its row targets one dataset of the
owner's per caller ("doomed", the caller's own copy): the owner deletes its copy (shared with the
analyst, with the analyst's job queued on it), the analyst is refused on its copy (an active
grant: 403), the other tenant and the revoked analyst do not see theirs (404), whatever the order
the rows run in.

The table is the spec. ``test_every_route_is_in_the_matrix`` enumerates ``app.routes``: a new
endpoint fails it until its rows are added here. 404 (never 403) answers objects a caller may
not know exist, and such a 404 is byte-for-byte the 404 of an id that does not exist.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.main import create_app
from kernel.access.keys import key_digest, revoke_api_key
from kernel.bootstrap import migrate
from kernel.config import Settings
from kernel.datasets.content_identity import content_digest
from kernel.db.engine import Database
from kernel.db.orm import ApiKey, Tenant
from kernel.ingest.limits import IngestLimits
from tests.conftest import RecordingDispatcher, make_settings, new_key, to_csv
from worker.runner import JobRunner

OWNER, ANALYST, OTHER, REVOKED = "owner", "analyst", "other tenant", "revoked analyst"
NO_KEY, MALFORMED, DELETED = "no key", "malformed key", "deleted key"
TENANT_CALLERS = (OWNER, ANALYST, OTHER, REVOKED)
ANONYMOUS_CALLERS = (NO_KEY, MALFORMED, DELETED)
CALLERS = TENANT_CALLERS + ANONYMOUS_CALLERS

TENANT_NAMES = {OWNER: "tn-owner-alice", ANALYST: "tn-analyst-bob", OTHER: "tn-other-carol", REVOKED: "tn-revoked-dave"}
SHARED_NAME, OTHER_NAME = "shared-ds-9d1f", "private-ds-4e2c"
GHOST = {"dataset": "ds_" + "0" * 24, "job": "job_" + "0" * 24, "tuning": "tun_" + "0" * 24}


# ------------------------------------------------------------------------------------ the world


@dataclass
class World:
    client: TestClient
    app: FastAPI
    headers: dict[str, dict[str, str]]
    ids: dict[str, str]
    """ds_shared (owner's, granted to the analyst), ds_other (other tenant's); job_owner (owner's
    own job on ds_shared, queued), job_analyst / job_revoked (succeeded jobs of the analyst and of
    the revoked analyst on ds_shared), job_other (the other tenant's, queued); tenant:<caller>;
    ds_doomed@<caller>: the owner's dataset that caller's DELETE row targets."""
    forbidden: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _spec(dataset_id: str, *, epsilon: float = 0.5) -> dict[str, Any]:
    return {
        "dataset_id": dataset_id,
        "model": {"name": "logistic-regression", "params": {}},
        "algorithm": {"name": "dp-sgd", "hyperparameters": {"clipping_norm": 1.0}},
        "privacy": {"target_epsilon": epsilon},
        "training": {"steps": 4, "batch_size": 64, "learning_rate": 0.5},
    }


def _tuning(dataset_id: str) -> dict[str, Any]:
    base = _spec(dataset_id, epsilon=0.5)
    base["evaluation"] = {"holdout_fraction": 0.2, "mechanism": "laplace", "epsilon": 0.1}
    base["training"]["time_limit_s"] = 5
    return {
        "base": base,
        "search_space": {"training.learning_rate": [0.1, 1.0]},
        "trials": {"mean": 1.5, "maximum": 3},
        "selection": {"metric": "accuracy"},
    }


def _small_csv(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return to_csv(rng.random((300, 4)), rng.integers(0, 2, 300))


DOOMED_SEEDS = {OWNER: 11, ANALYST: 12, OTHER: 13, REVOKED: 14}
"""The content of each caller's copy of the dataset its DELETE row targets (all the owner's)."""


def _doomed(world_ids: dict[str, str], client: TestClient, headers: dict[str, dict[str, str]]) -> None:
    """One owner's dataset per caller for the DELETE row: the owner's copy is shared with the
    analyst, who has a queued job on it; the analyst's copy is shared with it; the revoked
    analyst's was shared, then revoked; the other tenant's was never shared."""
    for caller, seed in DOOMED_SEEDS.items():
        world_ids[f"ds_doomed@{caller}"] = _upload(client, headers[OWNER], f"doomed-{caller}", _small_csv(seed))
    for caller, grantee in ((OWNER, ANALYST), (ANALYST, ANALYST), (REVOKED, REVOKED)):
        dataset = world_ids[f"ds_doomed@{caller}"]
        invited = client.post(
            f"/v1/datasets/{dataset}/grants", headers=headers[OWNER], json={"tenant": TENANT_NAMES[grantee]}
        )
        assert invited.status_code == 202, invited.text
        assert client.post(f"/v1/invitations/{dataset}/accept", headers=headers[grantee]).status_code == 200
    _submit(client, headers[ANALYST], world_ids[f"ds_doomed@{OWNER}"])
    revoked = client.delete(
        f"/v1/datasets/{world_ids[f'ds_doomed@{REVOKED}']}/grants/{TENANT_NAMES[REVOKED]}", headers=headers[OWNER]
    )
    assert revoked.status_code == 200
    for caller in ANONYMOUS_CALLERS:
        world_ids[f"ds_doomed@{caller}"] = world_ids[f"ds_doomed@{OWNER}"]


def _upload(client: TestClient, headers: dict[str, str], name: str, body: bytes) -> str:
    params = {"name": name, "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5}
    response = client.post("/v1/datasets", headers=headers, params=params, content=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _submit(client: TestClient, headers: dict[str, str], dataset_id: str) -> str:
    response = client.post("/v1/jobs", headers=headers, json=_spec(dataset_id))
    assert response.status_code == 202, response.text
    return response.json()["id"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    settings: Settings = make_settings(
        tmp_path_factory.mktemp("authz") / "data",
        sse_max_stream_s=0.2,
        sse_poll_interval_s=0.05,
        sse_keepalive_s=0.1,
    )
    migrate(settings)
    database = Database(settings.resolved_database_url)
    keys = {caller: new_key(database, name) for caller, name in TENANT_NAMES.items()}
    deleted = new_key(database, TENANT_NAMES[OWNER])  # a second key of the owner, then deleted
    for name in ("tn-spare-frank", "tn-spare-gina"):
        new_key(database, name)
    headers = {caller: {"Authorization": f"Bearer {key}"} for caller, key in keys.items()}
    headers[NO_KEY] = {}
    headers[MALFORMED] = {"Authorization": "Basic dG46cGFzcw=="}
    headers[DELETED] = {"Authorization": f"Bearer {deleted}"}
    app = create_app(settings, dispatcher=RecordingDispatcher())
    runner = JobRunner(settings, db=database)
    with TestClient(app, follow_redirects=False) as client:
        ids: dict[str, str] = {}
        ids["ds_shared"] = _upload(client, headers[OWNER], SHARED_NAME, _small_csv(1))
        ids["ds_other"] = _upload(client, headers[OTHER], OTHER_NAME, _small_csv(2))
        for grantee in (ANALYST, REVOKED, "tn-spare-gina"):
            name = TENANT_NAMES.get(grantee, grantee)
            assert (
                client.post(
                    f"/v1/datasets/{ids['ds_shared']}/grants", headers=headers[OWNER], json={"tenant": name}
                ).status_code
                == 202
            )
        for grantee in (ANALYST, REVOKED):  # gina's invitation stays pending
            assert (
                client.post(f"/v1/invitations/{ids['ds_shared']}/accept", headers=headers[grantee]).status_code == 200
            )
        assert (
            client.post(
                f"/v1/datasets/{ids['ds_other']}/grants", headers=headers[OTHER], json={"tenant": "tn-spare-gina"}
            ).status_code
            == 202
        )
        _doomed(ids, client, headers)
        ids["job_owner"] = _submit(client, headers[OWNER], ids["ds_shared"])
        ids["job_analyst"] = _submit(client, headers[ANALYST], ids["ds_shared"])
        ids["job_revoked"] = _submit(client, headers[REVOKED], ids["ds_shared"])
        ids["job_other"] = _submit(client, headers[OTHER], ids["ds_other"])
        tuning = client.post("/v1/tuning-jobs", headers=headers[OWNER], json=_tuning(ids["ds_shared"]))
        assert tuning.status_code == 202, tuning.text
        ids["tuning_owner"] = tuning.json()["id"]
        for job in ("job_analyst", "job_revoked"):
            assert runner.run(ids[job]) == "succeeded"
        assert (
            client.delete(
                f"/v1/datasets/{ids['ds_shared']}/grants/{TENANT_NAMES[REVOKED]}", headers=headers[OWNER]
            ).status_code
            == 200
        )
        with database.write_transaction() as tx:
            key = tx.scalar(select(ApiKey).where(ApiKey.digest == key_digest(deleted)))
            assert key is not None and revoke_api_key(tx, key)
            for caller, name in TENANT_NAMES.items():
                ids[f"tenant:{caller}"] = tx.scalar(select(Tenant.id).where(Tenant.name == name))
        world = World(client=client, app=app, headers=headers, ids=ids)
        world.forbidden = _forbidden_strings(ids)
        yield world
    database.dispose()


def _content_digest(body: bytes) -> str:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "upload.csv"
        path.write_bytes(body)
        return content_digest(path, fmt="csv", limits=IngestLimits())


SHARED_SHA256 = hashlib.sha256(_small_csv(1)).hexdigest()
OTHER_SHA256 = hashlib.sha256(_small_csv(2)).hexdigest()
SHARED_DIGEST, OTHER_DIGEST = _content_digest(_small_csv(1)), _content_digest(_small_csv(2))
"""Exact functions of the rows (docs/privacy-model.md §2): only each dataset's owner may see them."""


def _forbidden_strings(ids: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """What each caller must never see: other tenants' object ids, names and tenant ids, and the
    content hash of any dataset it does not own."""
    shared = (ids["ds_shared"], SHARED_NAME)
    other = (
        ids["ds_other"],
        OTHER_NAME,
        ids["job_other"],
        ids[f"tenant:{OTHER}"],
        TENANT_NAMES[OTHER],
        OTHER_SHA256,
        OTHER_DIGEST,
    )
    doomed = tuple(ids[f"ds_doomed@{caller}"] for caller in DOOMED_SEEDS)
    unseen = {
        OWNER: other,
        ANALYST: other
        + (
            ids["job_owner"],
            ids["job_revoked"],
            ids[f"tenant:{REVOKED}"],
            TENANT_NAMES[REVOKED],
            SHARED_SHA256,
            SHARED_DIGEST,
        ),
        OTHER: shared
        + doomed
        + (ids["job_owner"], ids["job_analyst"], ids["job_revoked"], SHARED_SHA256, SHARED_DIGEST)
        + tuple(ids[f"tenant:{c}"] for c in (OWNER, ANALYST, REVOKED))
        + tuple(TENANT_NAMES[c] for c in (OWNER, ANALYST, REVOKED)),
        REVOKED: other
        + (
            ids["job_owner"],
            ids["job_analyst"],
            ids[f"tenant:{ANALYST}"],
            TENANT_NAMES[ANALYST],
            SHARED_SHA256,
            SHARED_DIGEST,
        ),
    }
    everything = tuple(
        sorted(
            set(ids.values())
            | {SHARED_NAME, OTHER_NAME, SHARED_SHA256, OTHER_SHA256, SHARED_DIGEST, OTHER_DIGEST}
            | set(TENANT_NAMES.values())
        )
    )
    return {**unseen, **{caller: everything for caller in ANONYMOUS_CALLERS}}


def _leaked_sizes(body: str, caller: str) -> list[int]:
    """Byte sizes of datasets the caller does not own, as standalone numbers in the body."""
    shared, other = len(_small_csv(1)), len(_small_csv(2))
    sizes = {OWNER: (other,), OTHER: (shared,)}.get(caller, (shared, other))
    return [size for size in sizes if re.search(rf"(?<![0-9A-Za-z.]){size}(?![0-9A-Za-z.])", body)]


# ------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Case:
    method: str
    route: str
    target: str
    expect: Mapping[str, int]
    params: Mapping[str, str] = field(default_factory=dict)
    """path parameter → key in World.ids (an object of the world) or, prefixed '=', a literal."""
    query: Mapping[str, str] = field(default_factory=dict)
    json: Callable[[World], Any] | None = None
    content: Callable[[World], bytes] | None = None

    @property
    def label(self) -> str:
        return f"{self.method} {self.route} [{self.target}]"

    def path(self, world: World, caller: str, *, ghost: bool = False) -> str:
        """A reference ending in '@' names each caller's own object (``ref@caller``)."""
        values = {}
        for name, ref in self.params.items():
            if ref.startswith("="):
                values[name] = ref[1:]
            else:
                key = f"{ref}{caller}" if ref.endswith("@") else ref
                values[name] = GHOST[ref.split("_")[0].replace("ds", "dataset")] if ghost else world.ids[key]
        return self.route.format(**values)


def v1(owner: int, analyst: int, other: int, revoked: int) -> dict[str, int]:
    """An API-key endpoint: the four tenants as given, every caller without a valid key 401."""
    return {OWNER: owner, ANALYST: analyst, OTHER: other, REVOKED: revoked} | {c: 401 for c in ANONYMOUS_CALLERS}


def everyone(status: int) -> dict[str, int]:
    return {caller: status for caller in CALLERS}


def ui(owner: int, analyst: int, other: int, revoked: int, *, anonymous: int = 303) -> dict[str, int]:
    """A dashboard page: without a valid key it redirects to /ui/login (303)."""
    return {OWNER: owner, ANALYST: analyst, OTHER: other, REVOKED: revoked} | {c: anonymous for c in ANONYMOUS_CALLERS}


SHARED, PRIVATE = {"dataset_id": "ds_shared"}, {"dataset_id": "ds_other"}
MISSING_BASE_MODEL = {"base_model_id": "=bm_x"}


def _job(name: str) -> dict[str, str]:
    return {"job_id": name}


JOB_TARGETS = {  # target → (path params, expected for GET job / events)
    "analyst's job": (_job("job_analyst"), v1(200, 200, 404, 404)),
    "owner's job": (_job("job_owner"), v1(200, 404, 404, 404)),
    "revoked analyst's job": (_job("job_revoked"), v1(200, 404, 404, 200)),
    "other tenant's job": (_job("job_other"), v1(404, 404, 200, 404)),
}
ARTIFACTS = {  # queued jobs have no artifacts (409) for those who may see them
    "analyst's job": v1(200, 200, 404, 404),
    "owner's job": v1(409, 404, 404, 404),
    "revoked analyst's job": v1(200, 404, 404, 200),
    "other tenant's job": v1(404, 404, 409, 404),
}
CANCEL = {  # succeeded jobs: 409 = allowed but not cancellable; queued ones are cancelled (202)
    "analyst's job": v1(409, 409, 404, 404),
    "owner's job": v1(202, 404, 404, 404),
    "revoked analyst's job": v1(409, 404, 404, 403),
    "other tenant's job": v1(404, 404, 202, 404),
}
UI_JOB = {  # the dashboard shows a tenant its own jobs only (api/routes/ui.py: job_of_tenant)
    "analyst's job": ui(404, 200, 404, 404),
    "owner's job": ui(200, 404, 404, 404),
    "revoked analyst's job": ui(404, 404, 404, 200),
    "other tenant's job": ui(404, 404, 200, 404),
}
UI_REPORT = {
    target: {c: (409 if s == 200 and target in ("owner's job", "other tenant's job") else s) for c, s in expect.items()}
    for target, expect in UI_JOB.items()
}


def _grant_body(world: World) -> dict[str, str]:
    return {"tenant": "tn-spare-frank"}


CASES: tuple[Case, ...] = (
    Case("GET", "/openapi.json", "schema", everyone(200)),
    Case("GET", "/docs", "schema", everyone(200)),
    Case("GET", "/docs/assets/{name}", "schema", everyone(200), params={"name": "=swagger-ui-bundle.js"}),
    Case("GET", "/redoc", "schema", everyone(200)),
    Case("GET", "/healthz", "liveness", everyone(200)),
    Case("GET", "/readyz", "readiness", everyone(200)),
    Case("GET", "/metrics", "metrics", everyone(200)),
    Case("GET", "/v1/algorithms", "catalogue", v1(200, 200, 200, 200)),
    Case("GET", "/v1/algorithms/{name}", "catalogue", v1(200, 200, 200, 200), params={"name": "=dp-sgd"}),
    Case("GET", "/v1/models", "catalogue", v1(200, 200, 200, 200)),
    Case(
        "POST",
        "/v1/datasets",
        "new upload",
        v1(201, 201, 201, 201),
        query={"name": "upload", "format": "csv", "label_column": "label", "epsilon": "1", "delta": "1e-5"},
        content=lambda world: _small_csv(3),
    ),
    Case("GET", "/v1/datasets", "list", v1(200, 200, 200, 200)),
    Case("GET", "/v1/datasets", "list with tombstones", v1(200, 200, 200, 200), query={"include_deleted": "true"}),
    # Each caller's own copy (see DOOMED_SEEDS): the owner's deletion cancels the analyst's queued
    # job, finds nothing running and erases at once (200); an analyst may not delete (403).
    Case(
        "DELETE",
        "/v1/datasets/{dataset_id}",
        "each caller's doomed dataset",
        v1(200, 403, 404, 404),
        params={"dataset_id": "ds_doomed@"},
    ),
    # Base models are tenant-scoped (tests/api/test_api_base_models.py checks another tenant's id
    # answers 404); here: a body that is not safetensors, and an id nobody has.
    Case(
        "POST",
        "/v1/base-models",
        "not safetensors",
        v1(422, 422, 422, 422),
        query={"name": "bm", "architecture": "logistic-regression", "input_shape": "4", "n_outputs": "2"},
        content=lambda world: b"not a safetensors file",
    ),
    Case("GET", "/v1/base-models", "list", v1(200, 200, 200, 200)),
    *(
        Case(method, "/v1/base-models/{base_model_id}", "missing", v1(404, 404, 404, 404), params=MISSING_BASE_MODEL)
        for method in ("GET", "DELETE")
    ),
    # Tokenizers are tenant-scoped (tests/api/test_api_tokenizers.py checks another tenant's id answers
    # 404); here: a body that is not a tokenizer.json, the built-in one, an id nobody has, and training
    # on the shared (private) dataset: refused to whoever may read it, 404 to the others.
    Case(
        "POST",
        "/v1/tokenizers",
        "not a tokenizer",
        v1(422, 422, 422, 422),
        query={"name": "tok"},
        content=lambda world: b"not a tokenizer.json",
    ),
    Case("GET", "/v1/tokenizers", "list", v1(200, 200, 200, 200)),
    Case("GET", "/v1/tokenizers/{tokenizer_id}", "built-in", v1(200, 200, 200, 200), params={"tokenizer_id": "=byte"}),
    Case("GET", "/v1/tokenizers/{tokenizer_id}", "missing", v1(404, 404, 404, 404), params={"tokenizer_id": "=tok_x"}),
    Case(
        "POST",
        "/v1/tokenizers/train",
        "shared dataset (private)",
        v1(409, 409, 404, 404),
        json=lambda world: {"dataset_id": world.ids["ds_shared"], "vocab_size": 300, "name": "tok"},
    ),
    Case("GET", "/v1/invitations", "list", v1(200, 200, 200, 200)),
    *(
        case
        for target, params, read, own in (
            ("shared dataset", SHARED, v1(200, 200, 404, 404), v1(200, 403, 404, 404)),
            ("other tenant's dataset", PRIVATE, v1(404, 404, 200, 404), v1(404, 404, 200, 404)),
        )
        for case in (
            Case("GET", "/v1/datasets/{dataset_id}", target, read, params=params),
            Case("GET", "/v1/datasets/{dataset_id}/budget", target, read, params=params),
            Case(
                "POST",
                "/v1/datasets/{dataset_id}/budget",
                target,
                own,
                params=params,
                json=lambda world: {"epsilon": 9.0, "reason": "matrix"},
            ),
            Case("GET", "/v1/datasets/{dataset_id}/ledger", target, own, params=params),
            Case("GET", "/v1/datasets/{dataset_id}/grants", target, own, params=params),
            Case(
                "POST",
                "/v1/datasets/{dataset_id}/grants",
                target,
                {c: 202 if s == 200 else s for c, s in own.items()},
                params=params,
                json=_grant_body,
            ),
            Case(
                "DELETE",
                "/v1/datasets/{dataset_id}/grants/{grantee}",
                target,
                own,
                params={**params, "grantee": "=tn-spare-gina"},
            ),
            # Nobody in the matrix holds a pending invitation (the analyst accepted its own): the
            # addressee's 200 is in test_api_invitations.py.
            Case(
                "POST",
                "/v1/invitations/{invitation_id}/accept",
                target,
                v1(404, 404, 404, 404),
                params={"invitation_id": params["dataset_id"]},
            ),
            Case(
                "POST",
                "/v1/invitations/{invitation_id}/decline",
                target,
                v1(404, 404, 404, 404),
                params={"invitation_id": params["dataset_id"]},
            ),
            Case("POST", "/v1/jobs/estimate", target, read, json=lambda w, p=params: _spec(w.ids[p["dataset_id"]])),
            Case(
                "POST",
                "/v1/jobs",
                target,
                {c: 202 if s == 200 else s for c, s in read.items()},
                json=lambda w, p=params: _spec(w.ids[p["dataset_id"]], epsilon=0.3),
            ),
            Case(
                "POST",
                "/v1/tuning-jobs/estimate",
                target,
                read,
                json=lambda w, p=params: _tuning(w.ids[p["dataset_id"]]),
            ),
            Case(
                "POST",
                "/v1/tuning-jobs",
                target,
                {c: 202 if s == 200 else s for c, s in read.items()},
                json=lambda w, p=params: _tuning(w.ids[p["dataset_id"]]),
            ),
            Case(
                "GET",
                "/ui/datasets/{dataset_id}",
                target,  # the dashboard: owners and accepted analysts
                ui(
                    *(200 if c in ((OWNER, ANALYST) if params is SHARED else (OTHER,)) else 404 for c in TENANT_CALLERS)
                ),
                params=params,
            ),
        )
    ),
    Case("GET", "/v1/jobs", "list", v1(200, 200, 200, 200)),
    Case("GET", "/v1/jobs", "list, shared dataset filter", v1(200, 200, 200, 200), query={"dataset_id": "@ds_shared"}),
    *(
        case
        for target, (params, read) in JOB_TARGETS.items()
        for case in (
            Case("GET", "/v1/jobs/{job_id}", target, read, params=params),
            Case("GET", "/v1/jobs/{job_id}/events", target, read, params=params),
            Case("GET", "/v1/jobs/{job_id}/model", target, ARTIFACTS[target], params=params),
            Case("GET", "/v1/jobs/{job_id}/report", target, ARTIFACTS[target], params=params),
            Case(
                "GET",
                "/v1/jobs/{job_id}/report",
                f"{target}, html",
                ARTIFACTS[target],
                params=params,
                query={"format": "html"},
            ),
            Case("GET", "/ui/jobs/{job_id}", target, UI_JOB[target], params=params),
            Case("GET", "/ui/jobs/{job_id}/report", target, UI_REPORT[target], params=params),
            Case(
                "GET",
                "/ui/jobs/{job_id}/events",
                target,
                {**UI_JOB[target], **dict.fromkeys(ANONYMOUS_CALLERS, 401)},
                params=params,
            ),
            Case(
                "POST",
                "/v1/jobs/{job_id}/generate",
                target,  # every job here trained a tabular model: 422 not-a-language-model for its readers
                {c: 422 if s == 200 else s for c, s in read.items()},
                params=params,
                json=lambda world: {"prompt": "hi"},
            ),
            Case("POST", "/v1/jobs/{job_id}/cancel", target, CANCEL[target], params=params),
        )
    ),
    Case("GET", "/v1/tuning-jobs", "list", v1(200, 200, 200, 200)),
    # A tuning is seen and cancelled with its job's rules: the owner's own tuning, queued.
    Case(
        "GET",
        "/v1/tuning-jobs/{tuning_id}",
        "owner's tuning",
        v1(200, 404, 404, 404),
        params={"tuning_id": "tuning_owner"},
    ),
    Case("GET", "/v1/tuning-jobs/{tuning_id}", "missing", v1(404, 404, 404, 404), params={"tuning_id": "=tun_x"}),
    Case(
        "POST",
        "/v1/tuning-jobs/{tuning_id}/cancel",
        "owner's tuning",
        v1(202, 404, 404, 404),
        params={"tuning_id": "tuning_owner"},
    ),
    Case("GET", "/ui", "dashboard home", ui(303, 303, 303, 303)),
    Case("GET", "/ui/login", "login form", everyone(200)),
    Case("POST", "/ui/login", "login without CSRF token", everyone(403)),
    Case("POST", "/ui/logout", "logout without CSRF token", everyone(403)),
    Case(
        "POST",
        "/ui/jobs/{job_id}/cancel",
        "cancel without CSRF token",
        everyone(403),
        params={"job_id": "=job_missing"},
    ),
    Case(
        "POST",
        "/ui/invitations/{dataset_id}/accept",
        "accept without CSRF token",
        everyone(403),
        params={"dataset_id": "ds_shared"},
    ),
    Case(
        "POST",
        "/ui/invitations/{dataset_id}/decline",
        "decline without CSRF token",
        everyone(403),
        params={"dataset_id": "ds_shared"},
    ),
    Case("GET", "/ui/datasets", "dashboard list", ui(200, 200, 200, 200)),
    Case("GET", "/ui/jobs", "dashboard list", ui(200, 200, 200, 200)),
)
"""Cancel rows come last within each job target, so the statuses above them see the fixture's
states (a cancelled queued job still has no artifacts: 409 either way)."""


KNOWN_LEAKS: dict[tuple[str, str], str] = {}
"""Cells that reveal other tenants' data today, with where the fix belongs. Each one is an
expected failure that turns into a hard failure once fixed, so the entry must then be removed."""


# ------------------------------------------------------------------------------------ the tests


def _app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path) of every route; HEAD is Starlette's automatic twin of GET and not listed."""
    routes = set()
    for context in iter_route_contexts(app.routes):
        for method in getattr(context, "methods", None) or ():
            if method != "HEAD":
                routes.add((method, context.path))
    return routes


def test_every_route_is_in_the_matrix(world: World) -> None:
    routes = _app_routes(world.app)
    covered = {(case.method, case.route) for case in CASES}
    assert routes - covered == set(), "routes without rows in the authorization matrix"
    assert covered - routes == set(), "rows for routes that do not exist any more"
    assert len(routes) >= 35


def _call(world: World, case: Case, caller: str, *, ghost: bool = False) -> Any:
    query = {k: (world.ids[v[1:]] if v.startswith("@") else v) for k, v in case.query.items()}
    return world.client.request(
        case.method,
        case.path(world, caller, ghost=ghost),
        headers=world.headers[caller],
        params=query,
        json=case.json(world) if case.json else None,
        content=case.content(world) if case.content else None,
    )


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.label)
def test_authorization_matrix(world: World, case: Case, caller: str) -> None:
    response = _call(world, case, caller)
    expected = case.expect[caller]
    assert response.status_code == expected, f"{case.label} as {caller}: {response.status_code} {response.text[:300]}"
    # A problem's ``instance`` echoes the caller's own request path: that reveals nothing.
    body = response.content.decode("utf-8", errors="replace").replace(case.path(world, caller), "")
    leaked: list[object] = [s for s in world.forbidden[caller] if s in body]
    leaked += _leaked_sizes(body, caller)
    known = KNOWN_LEAKS.get((case.label, caller))
    if known is not None:
        assert leaked, f"{case.label} no longer leaks: remove it from KNOWN_LEAKS"
        pytest.xfail(f"known leak, to fix in {known}: {leaked}")
    assert not leaked, f"{case.label} as {caller} revealed {leaked}"
    if expected in (401, 403, 404) and not case.route.startswith("/ui/"):
        assert response.headers["content-type"].startswith("application/problem+json")
    if expected == 404 and case.params and any(not v.startswith("=") for v in case.params.values()):
        ghost = _call(world, case, caller, ghost=True)
        fields = ("type", "title", "status", "detail")
        assert ghost.status_code == 404
        assert {k: response.json()[k] for k in fields} == {k: ghost.json()[k] for k in fields}, (
            "a hidden object must answer exactly like one that does not exist"
        )


def test_lists_show_each_caller_its_own_view(world: World) -> None:
    ids, client, h = world.ids, world.client, world.headers

    def datasets(caller: str) -> dict[str, str]:
        return {
            d["id"]: d["role"]
            for d in client.get("/v1/datasets", headers=h[caller], params={"limit": 200}).json()["items"]
        }

    def jobs(caller: str, **query: str) -> set[str]:
        return {
            j["id"] for j in client.get("/v1/jobs", headers=h[caller], params={"limit": 200, **query}).json()["items"]
        }

    assert datasets(OWNER)[ids["ds_shared"]] == "owner" and ids["ds_other"] not in datasets(OWNER)
    assert datasets(ANALYST)[ids["ds_shared"]] == "analyst" and ids["ds_other"] not in datasets(ANALYST)
    assert ids["ds_shared"] not in datasets(REVOKED) and ids["ds_shared"] not in datasets(OTHER)
    fixture_jobs = {ids[k] for k in ("job_owner", "job_analyst", "job_revoked", "job_other")}
    assert jobs(OWNER) & fixture_jobs == {ids["job_owner"], ids["job_analyst"], ids["job_revoked"]}
    assert jobs(ANALYST) & fixture_jobs == {ids["job_analyst"]}
    assert jobs(REVOKED) & fixture_jobs == {ids["job_revoked"]}
    assert jobs(OTHER) & fixture_jobs == {ids["job_other"]}
    shared = {"dataset_id": ids["ds_shared"]}
    assert jobs(OWNER, **shared) >= {ids["job_owner"], ids["job_analyst"], ids["job_revoked"]}
    assert jobs(ANALYST, **shared) & fixture_jobs == {ids["job_analyst"]}
    assert jobs(OTHER, **shared) == set()


def test_no_endpoint_returns_raw_rows(world: World) -> None:
    """No response of the API carries the uploaded rows: the OpenAPI schema has no route that
    could (every route is in the matrix above), and the dataset views hold public facts only."""
    view = world.client.get(f"/v1/datasets/{world.ids['ds_shared']}", headers=world.headers[ANALYST]).json()
    assert set(view) <= {
        "id",
        "name",
        "format",
        "status",  # active, deleting, deleted (an analyst only ever sees active datasets)
        "deletion",
        "sha256",
        "content_digest",
        "size_bytes",
        "n_rows",
        "n_rows_public",  # whether a person-level dataset's row count is shown (docs/privacy-units.md)
        "feature_shape",
        "modality",
        "image_shape",
        "tokenizer_id",  # a text dataset's public declarations (docs/text.md)
        "vocab_size",
        "pad_id",
        "max_length",
        "text_field",
        "n_features",
        "task",
        "n_classes",
        "classes",
        "classes_source",
        "label_column",
        "privacy_unit_column",  # declared public by the owner at upload (docs/privacy-units.md)
        "n_units",
        "privacy_unit",
        "feature_names",
        "preparation",
        "budget",
        "public",
        "created_at",
        "links",
        "role",
        "notices",
        "ledger_continued",
    }
    assert view["sha256"] is None and view["size_bytes"] is None and view["content_digest"] is None
    rows = _small_csv(1).decode().splitlines()[1:4]
    for case in CASES:
        if case.method == "GET" and not case.route.startswith("/ui/jobs/{job_id}/events"):
            body = _call(world, case, OWNER).content.decode("utf-8", errors="replace")
            assert not any(row in body for row in rows), case.label
