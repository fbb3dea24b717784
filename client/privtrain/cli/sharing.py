"""Sharing a dataset: ``privtrain datasets grant|grants|revoke`` for its owner, and
``privtrain invitations`` for the tenants invited to analyse it."""

from __future__ import annotations

import click

from privtrain.cli.figures import up
from privtrain.cli.state import current_state, emit, json_flag
from privtrain.output import Column, key_values, table
from privtrain.resources import Grant, Invitation

GRANT_COLUMNS: list[Column[Grant]] = [
    Column("TENANT", lambda g: g.tenant, 30),
    Column("STATUS", lambda g: g.status),
    Column("INVITED", lambda g: g.granted_at),
    Column("BY", lambda g: g.granted_by, 30),
    Column("ACCEPTED", lambda g: g.accepted_at),
    Column("DECLINED", lambda g: g.declined_at),
    Column("REVOKED", lambda g: g.revoked_at),
]

INVITATION_COLUMNS: list[Column[Invitation]] = [
    Column("ID", lambda i: i.id),
    Column("DATASET", lambda i: i.dataset_name, 30),
    Column("OWNER", lambda i: i.owner, 30),
    Column("ε_G", lambda i: up(i.budget.epsilon) if i.budget is not None else "public"),
    Column("δ_G", lambda i: up(i.budget.delta) if i.budget is not None else "-"),
    Column("INVITED", lambda i: i.invited_at),
]


def _grant_block(g: Grant) -> str:
    return key_values(
        [
            ("dataset", g.dataset_id),
            ("tenant", g.tenant),
            ("status", g.status),
            ("invited", g.granted_at),
            ("invited by", g.granted_by),
            ("accepted", g.accepted_at),
            ("declined", g.declined_at),
            ("revoked", g.revoked_at),
            ("revoked by", g.revoked_by),
        ]
    )


def _invitation_block(i: Invitation) -> str:
    return key_values(
        [
            ("id", i.id),
            ("dataset", i.dataset_name),
            ("owner", i.owner),
            ("status", i.status),
            *(
                [("budget", "none: declared public by its owner")]
                if i.budget is None
                else [("budget ε_G", up(i.budget.epsilon)), ("budget δ_G", up(i.budget.delta))]
            ),
            ("invited", i.invited_at),
            ("accepted", i.accepted_at),
            ("declined", i.declined_at),
        ]
    )


@click.command("grant")
@click.argument("dataset_id")
@click.argument("tenant")
@json_flag
def datasets_grant(dataset_id: str, tenant: str) -> None:
    """Invite TENANT (by name) to analyse your dataset; it has access once it accepts.

    The answer is the same whether or not a tenant of that name exists; inviting again shows
    the pending invitation or active grant.
    """
    grant = current_state().client().grant(dataset_id, tenant)
    hint = f"note: access starts when {tenant} runs: privtrain invitations accept {dataset_id}"
    emit(grant, lambda: _grant_block(grant) + ("\n" + hint if grant.status == "invited" else ""))


@click.command("grants")
@click.argument("dataset_id")
@json_flag
def datasets_grants(dataset_id: str) -> None:
    """Every invitation and grant of your dataset, oldest first (the audit trail)."""
    found = current_state().client().list_grants(dataset_id)
    emit(found, lambda: table(found, GRANT_COLUMNS))


@click.command("revoke")
@click.argument("dataset_id")
@click.argument("tenant")
@json_flag
def datasets_revoke(dataset_id: str, tenant: str) -> None:
    """Revoke TENANT's access, or withdraw its pending invitation (it keeps its past jobs)."""
    grant = current_state().client().revoke_grant(dataset_id, tenant)
    emit(grant, lambda: _grant_block(grant))


@click.group()
def invitations() -> None:
    """Invitations other tenants sent you: accept one to analyse their dataset."""


@invitations.command("list")
@json_flag
def invitations_list() -> None:
    """Pending invitations addressed to you, newest first."""
    found = current_state().client().list_invitations()
    emit(found, lambda: table(found, INVITATION_COLUMNS))


@invitations.command("accept")
@click.argument("invitation_id")
@json_flag
def invitations_accept(invitation_id: str) -> None:
    """Accept: the dataset appears in `privtrain datasets list` and you may submit jobs on it."""
    invitation = current_state().client().accept_invitation(invitation_id)
    emit(invitation, lambda: _invitation_block(invitation))


@invitations.command("decline")
@click.argument("invitation_id")
@json_flag
def invitations_decline(invitation_id: str) -> None:
    """Decline (the owner sees it declined and may invite you again)."""
    invitation = current_state().client().decline_invitation(invitation_id)
    emit(invitation, lambda: _invitation_block(invitation))
