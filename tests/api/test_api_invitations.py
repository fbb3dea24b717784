"""Grants are invitations the named tenant accepts (issue 13, item 8).

Each test fails on the service as it was: an invitation answered 201 for an existing tenant and
404 for an unknown one (tenant enumeration), access started without the analyst's consent, and
a dataset with many long column names blew up the listings of every tenant it was granted to.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from kernel.db.engine import Database
from kernel.db.orm import DatasetGrant, Tenant
from kernel.db.pagination import encode_cursor
from tests.concurrency_helpers import concurrency_settings, live_server
from tests.conftest import counts, dp_sgd_spec, new_key, upload
from tests.sharing import race_invitations

GHOST_DATASET = "ds_" + "0" * 24
INVITATION_KEYS = {
    "id",
    "dataset_id",
    "dataset_name",
    "owner",
    "budget",
    "public",
    "invited_at",
    "status",
    "accepted_at",
    "declined_at",
    "links",
}


@pytest.fixture
def bob(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'bob')}"}


@pytest.fixture
def carol(database: Database) -> dict[str, str]:
    return {"Authorization": f"Bearer {new_key(database, 'carol')}"}


def _problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["type"] == f"/problems/{slug}"
    return response.json()


def _same_404(hidden: Any, ghost: Any) -> None:
    """A hidden object answers exactly like an id that does not exist."""
    fields = ("type", "title", "status", "detail")
    _problem(hidden, 404, "not-found")
    _problem(ghost, 404, "not-found")
    assert {k: hidden.json()[k] for k in fields} == {k: ghost.json()[k] for k in fields}


def _invite(client: TestClient, dataset_id: str, name: str, headers: dict[str, str] | None = None) -> Any:
    return client.post(f"/v1/datasets/{dataset_id}/grants", headers=headers, json={"tenant": name})


def _live_rows(database: Database, dataset_id: str) -> int:
    with database.read_session() as session:
        return (
            session.scalar(
                select(func.count())
                .select_from(DatasetGrant)
                .where(
                    DatasetGrant.dataset_id == dataset_id,
                    DatasetGrant.revoked_at.is_(None),
                    DatasetGrant.declined_at.is_(None),
                )
            )
            or 0
        )


# ------------------------------------------------------------------ no tenant enumeration


def _shape(body: dict[str, Any]) -> dict[str, Any]:
    """The body with what legitimately differs (the name typed, the time) blanked out."""
    return {k: (type(v).__name__ if k in ("tenant", "granted_at") else v) for k, v in body.items()}


def test_an_invitation_answers_alike_for_an_existing_and_an_unknown_tenant(
    alice: TestClient, bob: dict[str, str], dataset_id: str
) -> None:
    existing, unknown = _invite(alice, dataset_id, "bob"), _invite(alice, dataset_id, "no-such-tenant")
    assert existing.status_code == unknown.status_code == 202, (existing.text, unknown.text)
    assert existing.headers["content-type"] == unknown.headers["content-type"]
    assert _shape(existing.json()) == _shape(unknown.json())
    assert existing.json()["status"] == "invited" and existing.json()["active"] is False
    assert (existing.json()["tenant"], unknown.json()["tenant"]) == ("bob", "no-such-tenant")
    # Replays answer alike too.
    assert (
        _invite(alice, dataset_id, "bob").status_code == _invite(alice, dataset_id, "no-such-tenant").status_code == 200
    )


def test_the_invited_name_is_never_looked_up(alice: TestClient, dataset_id: str) -> None:
    """No statement on the invitation path touches the tenants table with the invited name: no
    lookup, hence no timing difference between tenants that exist and names that do not."""
    engine = alice.app.state.services.db.engine  # type: ignore[attr-defined]
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        assert _invite(alice, dataset_id, "bob-the-probe").status_code == 202
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert seen, "the listener saw no statement"
    lookups = [s for s, p in seen if "tenants" in s and "bob-the-probe" in repr(p)]
    assert lookups == []


def test_inviting_yourself_is_refused(alice: TestClient, dataset_id: str, database: Database) -> None:
    problem = _problem(_invite(alice, dataset_id, "alice"), 422, "invalid-grant")
    assert "invite itself" in problem["detail"]
    assert _live_rows(database, dataset_id) == 0


# ------------------------------------------------------------------ consent


def test_a_pending_invitation_gives_no_access(
    alice: TestClient, bob: dict[str, str], dataset_id: str, database: Database
) -> None:
    assert _invite(alice, dataset_id, "bob").status_code == 202
    before = counts(database)
    assert alice.get("/v1/datasets", headers=bob).json()["items"] == []
    for path in ("", "/budget", "/ledger"):
        _same_404(
            alice.get(f"/v1/datasets/{dataset_id}{path}", headers=bob),
            alice.get(f"/v1/datasets/{GHOST_DATASET}{path}", headers=bob),
        )
    _same_404(
        alice.post("/v1/jobs/estimate", headers=bob, json=dp_sgd_spec(dataset_id)),
        alice.post("/v1/jobs/estimate", headers=bob, json=dp_sgd_spec(GHOST_DATASET)),
    )
    _same_404(
        alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.0)),
        alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(GHOST_DATASET, target_epsilon=1.0)),
    )
    assert counts(database) == before  # no job, no reservation

    # What bob can see: the invitation, with public facts only.
    page = alice.get("/v1/invitations", headers=bob).json()
    assert page["next_cursor"] is None
    (invitation,) = page["items"]
    assert set(invitation) == INVITATION_KEYS
    assert invitation["id"] == invitation["dataset_id"] == dataset_id
    assert (invitation["dataset_name"], invitation["owner"], invitation["status"]) == ("digits", "alice", "invited")
    assert invitation["budget"] == {"epsilon": 8.0, "delta": 1e-5}
    assert invitation["links"] == {
        "accept": f"/v1/invitations/{dataset_id}/accept",
        "decline": f"/v1/invitations/{dataset_id}/decline",
    }
    # The owner does not see its own outgoing invitations there, nor does anyone else.
    assert alice.get("/v1/invitations").json()["items"] == []


def test_accepting_gives_the_analyst_role(alice: TestClient, bob: dict[str, str], dataset_id: str) -> None:
    assert _invite(alice, dataset_id, "bob").status_code == 202
    accepted = alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob)
    assert accepted.status_code == 200, accepted.text
    body = accepted.json()
    assert body["status"] == "active" and body["accepted_at"] is not None and body["declined_at"] is None
    assert body["links"] == {"dataset": f"/v1/datasets/{dataset_id}"}

    assert [(d["id"], d["role"]) for d in alice.get("/v1/datasets", headers=bob).json()["items"]] == [
        (dataset_id, "analyst")
    ]
    assert alice.post("/v1/jobs", headers=bob, json=dp_sgd_spec(dataset_id, target_epsilon=1.0)).status_code == 202
    assert alice.get("/v1/invitations", headers=bob).json()["items"] == []
    # Answered: no second answer.
    for answer in ("accept", "decline"):
        _problem(alice.post(f"/v1/invitations/{dataset_id}/{answer}", headers=bob), 404, "not-found")
    (grant,) = alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"]
    assert (grant["status"], grant["active"], grant["accepted_at"]) == ("active", True, body["accepted_at"])


def test_only_the_addressee_can_answer(
    alice: TestClient, bob: dict[str, str], carol: dict[str, str], dataset_id: str, database: Database
) -> None:
    assert _invite(alice, dataset_id, "bob").status_code == 202
    for answer in ("accept", "decline"):
        for caller in (carol, {}):  # another tenant; the owner itself (the client's own key)
            _same_404(
                alice.post(f"/v1/invitations/{dataset_id}/{answer}", headers=caller),
                alice.post(f"/v1/invitations/{GHOST_DATASET}/{answer}", headers=caller),
            )
        for junk in ("..", "x" * 300, "ds_%00", "%F0%9F%98%80"):
            _problem(alice.post(f"/v1/invitations/{junk}/{answer}", headers=bob), 404, "not-found")
    assert alice.get("/v1/invitations", headers=carol).json()["items"] == []
    (grant,) = alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"]
    assert grant["status"] == "invited"  # untouched
    with database.read_session() as session:
        assert session.scalar(select(DatasetGrant.grantee_tenant_id)) is None


def test_declining_and_inviting_again(alice: TestClient, bob: dict[str, str], dataset_id: str) -> None:
    assert _invite(alice, dataset_id, "bob").status_code == 202
    declined = alice.post(f"/v1/invitations/{dataset_id}/decline", headers=bob)
    assert declined.status_code == 200, declined.text
    assert declined.json()["status"] == "declined" and declined.json()["declined_at"] is not None
    assert declined.json()["links"] == {}
    assert alice.get("/v1/invitations", headers=bob).json()["items"] == []
    assert alice.get("/v1/datasets", headers=bob).json()["items"] == []
    _problem(alice.get(f"/v1/datasets/{dataset_id}", headers=bob), 404, "not-found")
    _problem(alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob), 404, "not-found")
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/bob"), 404, "not-found")  # nothing live

    # The owner may ask again: a new row, a new answer.
    again = _invite(alice, dataset_id, "bob")
    assert again.status_code == 202 and again.json()["status"] == "invited"
    assert [i["id"] for i in alice.get("/v1/invitations", headers=bob).json()["items"]] == [dataset_id]
    assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob).status_code == 200
    trail = alice.get(f"/v1/datasets/{dataset_id}/grants").json()["items"]
    assert [g["status"] for g in trail] == ["declined", "active"]
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob).json()["role"] == "analyst"


def test_the_owner_withdraws_a_pending_invitation(alice: TestClient, bob: dict[str, str], dataset_id: str) -> None:
    assert _invite(alice, dataset_id, "bob").status_code == 202
    withdrawn = alice.delete(f"/v1/datasets/{dataset_id}/grants/bob")
    assert withdrawn.status_code == 200, withdrawn.text
    body = withdrawn.json()
    assert (body["status"], body["active"], body["revoked_by"], body["accepted_at"]) == (
        "revoked",
        False,
        "alice",
        None,
    )
    assert alice.get("/v1/invitations", headers=bob).json()["items"] == []
    _problem(alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob), 404, "not-found")
    _problem(alice.delete(f"/v1/datasets/{dataset_id}/grants/bob"), 404, "not-found")
    # Withdrawing an invitation to a name that matches no tenant works the same way.
    assert _invite(alice, dataset_id, "no-such-tenant").status_code == 202
    assert alice.delete(f"/v1/datasets/{dataset_id}/grants/no-such-tenant").json()["status"] == "revoked"


# ------------------------------------------------------------------ one live row per name


def test_concurrent_invitations_of_one_name_leave_one_live_row(tmp_path: Path, digits_csv: bytes) -> None:
    """Real requests racing in a live server: one 202, the others replay it (200). (PostgreSQL:
    tests/services/test_invitations_postgres.py.)"""
    from kernel.bootstrap import migrate

    settings = concurrency_settings(tmp_path / "data")
    migrate(settings)
    with live_server(settings) as live, live.client(live.tenant_key("alice")) as owner:
        created = owner.post(
            "/v1/datasets",
            content=digits_csv,
            params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
        )
        assert created.status_code == 201, created.text
        dataset_id = created.json()["id"]
        answers = race_invitations(owner, dataset_id=dataset_id, grantee_name="bob", racers=8)
        assert sorted(a["status"] for a in answers) == [200] * 7 + [202]
        assert len({a["body"]["granted_at"] for a in answers}) == 1
        assert _live_rows(live.db, dataset_id) == 1


def test_an_insert_that_loses_the_race_is_answered_as_a_replay(
    alice: TestClient, dataset_id: str, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race made deterministic: the live row commits between our check and our insert (as
    a concurrent request's would without the budget lock), so the insert hits the partial
    unique index; the answer is the row that won, 200, and still one live row."""
    from kernel.access import grants

    with database.write_transaction() as tx:
        alice_id = tx.scalar(select(Tenant.id).where(Tenant.name == "alice"))
        tx.add(
            DatasetGrant(
                dataset_id=dataset_id,
                grantee_name="bob",
                granted_by=alice_id,
                granted_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
            )
        )
    real = grants._live_grant
    missed: list[bool] = []

    def miss_once(session: Any, *, dataset_id: str, grantee_name: str) -> Any:
        if not missed:
            missed.append(True)
            return None
        return real(session, dataset_id=dataset_id, grantee_name=grantee_name)

    monkeypatch.setattr(grants, "_live_grant", miss_once)
    replayed = _invite(alice, dataset_id, "bob")
    assert missed and replayed.status_code == 200, replayed.text
    assert replayed.json()["granted_at"].startswith("2026-01-01T00:00:00")
    assert _live_rows(database, dataset_id) == 1


# ------------------------------------------------------------------ bounded listings


def _page_through(client: TestClient, path: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = client.get(path, headers=headers, params=params)
        assert page.status_code == 200, page.text
        items.extend(page.json()["items"])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return items


def _small_csv(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    rows = "\n".join(
        f"{a:.3f},{b:.3f},{int(c)}"
        for a, b, c in zip(rng.random(40), rng.random(40), rng.integers(0, 2, 40), strict=True)
    )
    return f"a,b,label\n{rows}\n".encode()


def test_invitations_and_grants_are_paginated(alice: TestClient, bob: dict[str, str], carol: dict[str, str]) -> None:
    ids = [upload(alice, _small_csv(seed), name=f"d{seed}", delta=1e-3).json()["id"] for seed in range(3)]
    ids.append(upload(alice, _small_csv(9), name="d9", delta=1e-3, epsilon=1).json()["id"])
    for dataset_id in ids[:3]:
        assert _invite(alice, dataset_id, "bob").status_code == 202
    listed = _page_through(alice, "/v1/invitations", bob)
    assert sorted(i["id"] for i in listed) == sorted(ids[:3]) and len(listed) == 3
    assert [i["invited_at"] for i in listed] == sorted((i["invited_at"] for i in listed), reverse=True)
    # An answered invitation leaves the list; the cursor of the remaining ones still pages.
    assert alice.post(f"/v1/invitations/{listed[0]['id']}/decline", headers=bob).status_code == 200
    assert [i["id"] for i in _page_through(alice, "/v1/invitations", bob)] == [i["id"] for i in listed[1:]]

    trail_of = ids[3]
    for name in ("bob", "carol", "no-such-tenant"):
        assert _invite(alice, trail_of, name).status_code == 202
    assert alice.delete(f"/v1/datasets/{trail_of}/grants/carol").status_code == 200
    assert _invite(alice, trail_of, "carol").status_code == 202
    trail = _page_through(alice, f"/v1/datasets/{trail_of}/grants")
    assert [(g["tenant"], g["status"]) for g in trail] == [
        ("bob", "invited"),
        ("carol", "revoked"),
        ("no-such-tenant", "invited"),
        ("carol", "invited"),
    ]
    for path in ("/v1/invitations", f"/v1/datasets/{trail_of}/grants"):
        _problem(alice.get(path, params={"limit": 201}), 422, "validation-error")
        for payload in (["abc"], [2**70], [-1], ["2020-01-01", "ds_\u0000"], [{"x": 1}], []):
            _problem(alice.get(path, params={"cursor": encode_cursor(payload)}), 422, "invalid-cursor")


def _wide_csv(columns: int, name_chars: int, rows: int = 20) -> bytes:
    names = [f"{i:06d}".ljust(name_chars, "w") for i in range(columns)]
    rng = np.random.default_rng(3)
    body = "\n".join(",".join(["0"] * columns + [str(int(label))]) for label in rng.integers(0, 2, rows))
    return (",".join(names + ["label"]) + "\n" + body + "\n").encode()


def test_a_wide_dataset_does_not_blow_up_anyones_listing(
    alice: TestClient, bob: dict[str, str], carol: dict[str, str], dataset_id: str
) -> None:
    """carol owns a dataset with 1,500 columns of 256-character names (385 KB of names). Before
    the fix, granting it to bob put all of it in every item of bob's listing."""
    wide = alice.post(
        "/v1/datasets",
        headers=carol,
        content=_wide_csv(1500, 256),
        params={"name": "wide", "format": "csv", "label_column": "label", "epsilon": 1, "delta": 1e-3},
    )
    assert wide.status_code == 201, wide.text
    wide_id = wide.json()["id"]
    assert len(wide.json()["feature_names"]) == 1500
    assert _invite(alice, wide_id, "bob", headers=carol).status_code == 202
    assert len(alice.get("/v1/invitations", headers=bob).content) < 2_000  # pending: public facts only
    assert alice.post(f"/v1/invitations/{wide_id}/accept", headers=bob).status_code == 200
    assert _invite(alice, dataset_id, "bob").status_code == 202
    assert alice.post(f"/v1/invitations/{dataset_id}/accept", headers=bob).status_code == 200

    for headers in (bob, carol):
        listing = alice.get("/v1/datasets", headers=headers, params={"limit": 200})
        assert listing.status_code == 200
        assert len(listing.content) < 4_000, len(listing.content)  # each item a bounded summary
        for item in listing.json()["items"]:
            assert item["feature_names"] is None and item["classes"] is None
    items = {d["id"]: d for d in alice.get("/v1/datasets", headers=bob).json()["items"]}
    assert set(items) == {wide_id, dataset_id} and items[dataset_id]["classes_source"] == "observed"
    # The full view of one dataset still has them.
    assert len(alice.get(f"/v1/datasets/{wide_id}", headers=bob).json()["feature_names"]) == 1500
    assert alice.get(f"/v1/datasets/{dataset_id}", headers=bob).json()["classes"] == [str(i) for i in range(10)]
