"""privacy reports committed with a settlement, waiting for their upload to the blob store

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 13:00:00

A job's report used to be uploaded inside the transaction that settles it, which holds the
dataset's budget row: a slow object store stalled every admission on that dataset. The settling
transaction now stores the report's bytes here (its content-addressed key on the job row), and the
upload follows the commit; the worker, the API and the reconciler deliver what is pending.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pending_reports",
        sa.Column("job_id", sa.String(length=40), nullable=False),
        sa.Column("blob_key", sa.String(length=200), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_pending_reports_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", name="pk_pending_reports"),
    )


def downgrade() -> None:
    op.drop_table("pending_reports")
