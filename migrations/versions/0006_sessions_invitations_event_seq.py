"""dashboard sessions kept server-side; grants become invitations the analyst accepts; job events
numbered per job

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 17:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

LIVE = "revoked_at IS NULL AND declined_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("token_digest", sa.String(length=64), nullable=False),
        sa.Column("api_key_id", sa.String(length=40), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["api_key_id"], ["api_keys.id"], name=op.f("fk_ui_sessions_api_key_id_api_keys")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ui_sessions")),
        sa.UniqueConstraint("token_digest", name=op.f("uq_ui_sessions_token_digest")),
    )
    op.create_index(op.f("ix_ui_sessions_api_key_id"), "ui_sessions", ["api_key_id"])

    # Grants already given were effective: they count as accepted when they were granted.
    with op.batch_alter_table("dataset_grants") as batch:
        batch.add_column(sa.Column("grantee_name", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("accepted_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("declined_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE dataset_grants SET accepted_at = granted_at, "
        "grantee_name = (SELECT name FROM tenants WHERE tenants.id = dataset_grants.grantee_tenant_id)"
    )
    with op.batch_alter_table("dataset_grants") as batch:
        batch.drop_index("uq_dataset_grants_active")
        batch.alter_column("grantee_name", existing_type=sa.String(length=200), nullable=False)
        batch.alter_column("grantee_tenant_id", existing_type=sa.String(length=40), nullable=True)
        batch.create_index(batch.f("ix_dataset_grants_grantee_name"), ["grantee_name"])
        batch.create_index(
            "uq_dataset_grants_live",
            ["dataset_id", "grantee_name"],
            unique=True,
            sqlite_where=sa.text(LIVE),
            postgresql_where=sa.text(LIVE),
        )

    # Events are numbered 1, 2, 3 … per job (the global row id revealed the service's activity).
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("event_count", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("job_events") as batch:
        batch.add_column(sa.Column("seq", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE job_events SET seq = (SELECT COUNT(*) FROM job_events AS earlier "
        "WHERE earlier.job_id = job_events.job_id AND earlier.id <= job_events.id)"
    )
    op.execute("UPDATE jobs SET event_count = (SELECT COUNT(*) FROM job_events WHERE job_events.job_id = jobs.id)")
    with op.batch_alter_table("job_events") as batch:
        batch.alter_column("seq", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint("uq_job_events_job_seq", ["job_id", "seq"])


def downgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.drop_constraint("uq_job_events_job_seq", type_="unique")
        batch.drop_column("seq")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("event_count")
    # Pending and declined invitations never gave access: they leave with the columns.
    op.execute("DELETE FROM dataset_grants WHERE accepted_at IS NULL OR declined_at IS NOT NULL")
    with op.batch_alter_table("dataset_grants") as batch:
        batch.drop_index("uq_dataset_grants_live")
        batch.drop_index(batch.f("ix_dataset_grants_grantee_name"))
        batch.alter_column("grantee_tenant_id", existing_type=sa.String(length=40), nullable=False)
        batch.drop_column("declined_at")
        batch.drop_column("accepted_at")
        batch.drop_column("grantee_name")
        batch.create_index(
            "uq_dataset_grants_active",
            ["dataset_id", "grantee_tenant_id"],
            unique=True,
            sqlite_where=sa.text("revoked_at IS NULL"),
            postgresql_where=sa.text("revoked_at IS NULL"),
        )
    op.drop_index(op.f("ix_ui_sessions_api_key_id"), table_name="ui_sessions")
    op.drop_table("ui_sessions")
