"""Per-dataset roles: the owner invites analysts, they accept, the owner revokes; what each role
can do through the API. (The invitation flow itself: test_api_invitations.py.)"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from kernel.db.engine import Database
from kernel.db.orm import DatasetGrant, Tenant
from tests.conftest import dp_sgd_spec, new_key
from tests.sharing import share


@pytest.fixture
def bob(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'bob')}"}


def _tenant_id(database: Database, name: str) -> str:
    with database.read_session() as session:
        tenant = session.scalar(select(Tenant).where(Tenant.name == name))
        assert tenant is not None
        return tenant.id


def _problem(response: object, status: int, slug: str) -> None:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    assert response.headers["content-type"].startswith("application/problem+json")  # type: ignore[attr-defined]
    assert response.json()["type"] == f"/problems/{slug}"  # type: ignore[attr-defined]


def test_an_invitation_is_idempotent_and_listed(alice: TestClient, bob: dict[str, str], dataset_id: str) -> None:
    created = alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"})
    assert created.status_code == 202, created.text
    grant = created.json()
    assert grant["tenant"] == "bob" and grant["granted_by"] == "alice" and grant["dataset_id"] == dataset_id
    assert grant["status"] == "invited" and grant["active"] is False
    assert grant["accepted_at"] is None and grant["declined_at"] is None and grant["revoked_at"] is None
    again = alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"})
    assert again.status_code == 200 and again.json() == grant
    listed = alice.get(f"/v1/datasets/{dataset_id}/grants").json()
    assert [(g["tenant"], g["status"]) for g in listed["items"]] == [("bob", "invited")]
    assert listed["next_cursor"] is None
    # Accepted, a re-invitation still returns the one live row (now active).
    assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob).status_code == 200
    active = alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"})
    assert active.status_code == 200 and active.json()["status"] == "active" and active.json()["active"] is True
    assert active.json()["granted_at"] == grant["granted_at"] and active.json()["accepted_at"] is not None


def test_grant_errors(alice: TestClient, bob: dict[str, str], dataset_id: str) -> None:
    _problem(alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "alice"}), 422, "invalid-grant")
    _problem(alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob", "x": 1}), 422, "validation-error")
    for name in ('""', f'"{"x" * 201}"', '"bo\\u0000b"', '"\\ud800"', '"line\\nbreak"'):
        raw = alice.post(
            f"/v1/datasets/{dataset_id}/grants",
            content=f'{{"tenant": {name}}}',
            headers={"Content-Type": "application/json"},
        )
        _problem(raw, 422, "validation-error")
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/bob"), 404, "not-found")  # never invited
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/nobody"), 404, "not-found")
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/bo%00b"), 404, "not-found")
    _problem(alice.post("/v1/datasets/ds_missing/grants", json={"tenant": "bob"}), 404, "not-found")
    assert alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"] == []  # nothing left behind


def test_analyst_sees_facts_and_budget_and_submits_but_not_owner_only_things(
    alice: TestClient, bob: dict[str, str], dataset_id: str, database: Database
) -> None:
    share(alice, dataset_id=dataset_id, grantee_name="bob", grantee=bob)
    owner_job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()

    listed = alice.get("/v1/datasets", headers=bob).json()["items"]
    assert [(d["id"], d["role"]) for d in listed] == [(dataset_id, "analyst")]
    assert set(listed[0]["links"]) == {"self", "budget"}
    assert alice.get("/v1/datasets").json()["items"][0]["role"] == "owner"
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob).json()["role"] == "analyst"
    assert alice.get(f"/v1/datasets/{dataset_id}/budget", headers=bob).status_code == 200

    assert alice.post("/v1/jobs/estimate", headers=bob, json=dp_sgd_spec(dataset_id)).json()["admissible"]
    submitted = alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.0))
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()

    # Charged to the dataset's ledger, with the submitting analyst as the actor.
    entries = alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]
    reserve = next(e for e in entries if e["job_id"] == job["id"])
    assert reserve["kind"] == "RESERVE" and reserve["actor"] == f"tenant:{_tenant_id(database, 'bob')}"

    # Owner-only endpoints on a dataset the analyst can see: 403 forbidden, not 404.
    _problem(alice.get(f"/v1/datasets/{dataset_id}/ledger", headers=bob), 403, "forbidden")
    _problem(alice.post(f"/v1/datasets/{dataset_id}/budget", headers=bob, json={"epsilon": 50}), 403, "forbidden")
    _problem(alice.get(f"/v1/datasets/{dataset_id}/grants", headers=bob), 403, "forbidden")
    _problem(alice.post(f"/v1/datasets/{dataset_id}/grants", headers=bob, json={"tenant": "bob"}), 403, "forbidden")
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/bob", headers=bob), 403, "forbidden")

    # Jobs: the analyst sees its own only; the owner sees every job on its dataset.
    assert [j["id"] for j in alice.get("/v1/jobs", headers=bob).json()["items"]] == [job["id"]]
    _problem(alice.get(f"/v1/jobs/{owner_job['id']}", headers=bob), 404, "not-found")
    assert {j["id"] for j in alice.get("/v1/jobs").json()["items"]} == {job["id"], owner_job["id"]}
    filtered = alice.get("/v1/jobs", params={"dataset_id": dataset_id}).json()["items"]
    assert {j["id"] for j in filtered} == {job["id"], owner_job["id"]}
    assert [j["id"] for j in alice.get("/v1/jobs", headers=bob, params={"dataset_id": dataset_id}).json()["items"]] == [
        job["id"]
    ]
    assert alice.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    # The owner's pagination cursor may point at an analyst's job.
    first = alice.get("/v1/jobs", params={"limit": 1}).json()
    second = alice.get("/v1/jobs", params={"limit": 1, "cursor": first["next_cursor"]}).json()
    assert {first["items"][0]["id"], second["items"][0]["id"]} == {job["id"], owner_job["id"]}


def test_revoke_keeps_the_row_ends_access_but_not_the_analysts_own_jobs(
    alice: TestClient, bob: dict[str, str], dataset_id: str
) -> None:
    share(alice, dataset_id=dataset_id, grantee_name="bob", grantee=bob)
    job = alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()

    revoked = alice.delete(f"/v1/datasets/{dataset_id}/grants/bob")
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["active"] is False and revoked.json()["revoked_by"] == "alice"
    assert revoked.json()["status"] == "revoked" and revoked.json()["accepted_at"] is not None
    assert revoked.json()["revoked_at"] is not None

    assert alice.get("/v1/datasets", headers=bob).json()["items"] == []
    for response in (
        alice.get(f"/v1/datasets/{dataset_id}", headers=bob),
        alice.get(f"/v1/datasets/{dataset_id}/budget", headers=bob),
        alice.get(f"/v1/datasets/{dataset_id}/ledger", headers=bob),
        alice.post("/v1/jobs/estimate", headers=bob, json=dp_sgd_spec(dataset_id)),
        alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id)),
    ):
        _problem(response, 404, "not-found")
    # Its own past job stays readable; acting on it is not allowed any more.
    assert alice.get(f"/v1/jobs/{job['id']}", headers=bob).status_code == 200
    assert alice.get(f"/v1/jobs/{job['id']}/events", headers=bob).status_code == 200
    assert [j["id"] for j in alice.get("/v1/jobs", headers=bob).json()["items"]] == [job["id"]]
    _problem(alice.post(f"/v1/jobs/{job['id']}/cancel", headers=bob), 403, "forbidden")

    # A re-invitation adds a row (the revoked one stays in the audit trail) and needs a new yes.
    assert alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"}).status_code == 202
    _problem(alice.get(f"/v1/datasets/{dataset_id}", headers=bob), 404, "not-found")
    assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob).status_code == 200
    trail = alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"]
    assert [(g["status"], g["active"]) for g in trail] == [("revoked", False), ("active", True)]
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob).status_code == 200


def test_analyst_cancels_own_job_and_owner_can_cancel_an_analysts_job(
    alice: TestClient, bob: dict[str, str], dataset_id: str, database: Database
) -> None:
    share(alice, dataset_id=dataset_id, grantee_name="bob", grantee=bob)
    first = alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()
    second = alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.5)).json()
    owner_job = alice.post("/v1/jobs", json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).json()
    assert alice.post(f"/v1/jobs/{first['id']}/cancel", headers=bob).json()["status"] == "cancelled"
    _problem(alice.post(f"/v1/jobs/{owner_job['id']}/cancel", headers=bob), 404, "not-found")
    assert alice.post(f"/v1/jobs/{second['id']}/cancel").json()["status"] == "cancelled"
    releases = {
        e["job_id"]: e["actor"]
        for e in alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]
        if e["kind"] == "RELEASE"
    }
    assert releases == {
        first["id"]: f"tenant:{_tenant_id(database, 'bob')}",
        second["id"]: f"tenant:{_tenant_id(database, 'alice')}",
    }


def test_a_revoke_that_commits_while_a_submission_is_planned_wins(
    alice: TestClient, bob: dict[str, str], dataset_id: str, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission re-checks access under the budget lock that revokes take, so nothing is
    admitted for an analyst after its revoke committed, even a request already in flight."""
    import api.routes.jobs as jobs_api

    share(alice, dataset_id=dataset_id, grantee_name="bob", grantee=bob)
    real_plan_job = jobs_api.plan_job

    def plan_then_revoke(*args: object, **named: object) -> object:
        plan = real_plan_job(*args, **named)  # type: ignore[arg-type]
        assert alice.delete(f"/v1/datasets/{dataset_id}/grants/bob").status_code == 200
        return plan

    monkeypatch.setattr(jobs_api, "plan_job", plan_then_revoke)
    _problem(alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id)), 404, "not-found")
    kinds = [e["kind"] for e in alice.get(f"/v1/datasets/{dataset_id}/ledger").json()["items"]]
    assert kinds == []
    assert alice.get("/v1/jobs", headers=bob).json()["items"] == []


def test_at_most_one_live_row_per_name_in_the_database(
    alice: TestClient, bob: dict[str, str], dataset_id: str, database: Database
) -> None:
    from sqlalchemy.exc import IntegrityError

    alice_id = _tenant_id(database, "alice")
    for accepted in (False, True):  # a pending invitation, then an active grant
        if accepted:
            assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob).status_code == 200
        else:
            assert alice.post(f"/v1/datasets/{dataset_id}/grants", json={"tenant": "bob"}).status_code == 202
        with pytest.raises(IntegrityError), database.write_transaction() as tx:
            tx.add(DatasetGrant(dataset_id=dataset_id, grantee_name="bob", granted_by=alice_id))
