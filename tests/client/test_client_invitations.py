"""Sharing through the client and the CLI: the owner invites, the analyst lists, accepts or
declines, the owner revokes; against the real app in-process."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kernel.db.engine import Database
from privtrain import Client
from privtrain.cli import CliEnvironment, cli
from privtrain.errors import PrivtrainError
from privtrain.resources import Grant, Invitation
from tests.client.conftest import BASE_URL, AppTransport
from tests.conftest import new_key

Run = Callable[..., Result]


@pytest.fixture
def bob_key(database: Database) -> str:
    return new_key(database, "bob")


@pytest.fixture
def bob(transport: AppTransport, bob_key: str) -> Iterator[Client]:
    with Client(BASE_URL, bob_key, timeout=10, transport=transport) as c:
        yield c


@pytest.fixture
def dataset_id(client: Client, digits_path: Path) -> str:
    return client.upload_dataset(digits_path, epsilon=8, delta=1e-5).id


@pytest.fixture
def run(transport: AppTransport) -> Run:
    def invoke(key: str, *args: str) -> Result:
        return CliRunner().invoke(
            cli,
            list(args),
            obj=CliEnvironment(transport=transport),
            env={"PRIVTRAIN_URL": BASE_URL, "PRIVTRAIN_API_KEY": key},
        )

    return invoke


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return json.loads(result.stdout)


def test_client_invite_accept_revoke(client: Client, bob: Client, dataset_id: str) -> None:
    invited = client.grant(dataset_id, "bob")
    assert isinstance(invited, Grant)
    assert (invited.tenant, invited.status, invited.active, invited.granted_by) == ("bob", "invited", False, "alice")
    assert invited.granted_at is not None and invited.accepted_at is None
    assert client.grant(dataset_id, "bob").granted_at == invited.granted_at  # a replay, not a second row
    assert client.grant(dataset_id, "nobody-by-this-name").status == "invited"  # alike for unknown names
    assert bob.list_datasets() == []

    (invitation,) = bob.list_invitations()
    assert isinstance(invitation, Invitation)
    assert (invitation.id, invitation.dataset_name, invitation.owner, invitation.status) == (
        dataset_id,
        "digits",
        "alice",
        "invited",
    )
    assert (invitation.budget.epsilon, invitation.budget.delta) == (8.0, 1e-5)
    accepted = bob.accept_invitation(invitation.id)
    assert accepted.status == "active" and accepted.accepted_at is not None
    assert [d.id for d in bob.list_datasets()] == [dataset_id] and bob.list_invitations() == []

    with pytest.raises(PrivtrainError) as again:
        bob.accept_invitation(invitation.id)
    assert again.value.status == 404 and again.value.type == "/problems/not-found"

    revoked = client.revoke_grant(dataset_id, "bob")
    assert (revoked.status, revoked.active, revoked.revoked_by) == ("revoked", False, "alice")
    trail = client.list_grants(dataset_id, page_size=1)  # every page
    assert [(g.tenant, g.status) for g in trail] == [("bob", "revoked"), ("nobody-by-this-name", "invited")]
    assert bob.list_datasets() == []


def test_client_decline(client: Client, bob: Client, dataset_id: str) -> None:
    client.grant(dataset_id, "bob")
    declined = bob.decline_invitation(dataset_id)
    assert declined.status == "declined" and declined.declined_at is not None
    assert bob.list_invitations() == [] and bob.list_datasets() == []
    assert [g.status for g in client.list_grants(dataset_id)] == ["declined"]


def test_cli_sharing_commands(run: Run, api_key: str, bob_key: str, dataset_id: str) -> None:
    invited = ok_json(run(api_key, "datasets", "grant", dataset_id, "bob", "--json"))
    assert (invited["tenant"], invited["status"]) == ("bob", "invited")
    human = run(api_key, "datasets", "grant", dataset_id, "bob")
    assert human.exit_code == 0 and "invited" in human.stdout
    assert f"privtrain invitations accept {dataset_id}" in human.stdout

    table = run(bob_key, "invitations", "list")
    assert table.exit_code == 0
    assert "OWNER" in table.stdout and dataset_id in table.stdout and "alice" in table.stdout
    (listed,) = ok_json(run(bob_key, "invitations", "list", "--json"))
    assert listed["id"] == dataset_id and listed["status"] == "invited"

    accepted = run(bob_key, "invitations", "accept", dataset_id)
    assert accepted.exit_code == 0 and "active" in accepted.stdout
    assert [d["id"] for d in ok_json(run(bob_key, "datasets", "list", "--json"))] == [dataset_id]
    trail = run(api_key, "datasets", "grants", dataset_id)
    assert trail.exit_code == 0 and "STATUS" in trail.stdout and "active" in trail.stdout

    missing = run(bob_key, "invitations", "decline", dataset_id)  # answered already
    assert missing.exit_code == 1 and "404" in missing.stderr
    revoked = ok_json(run(api_key, "datasets", "revoke", dataset_id, "bob", "--json"))
    assert revoked["status"] == "revoked" and revoked["revoked_by"] == "alice"
    assert ok_json(run(bob_key, "datasets", "list", "--json")) == []

    ok_json(run(api_key, "datasets", "grant", dataset_id, "bob", "--json"))
    declined = ok_json(run(bob_key, "invitations", "decline", dataset_id, "--json"))
    assert declined["status"] == "declined"
    statuses = [g["status"] for g in ok_json(run(api_key, "datasets", "grants", dataset_id, "--json"))]
    assert statuses == ["revoked", "declined"]
