"""private hyperparameter tuning: each tuning and the job that runs its trials

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("dataset_id", sa.String(40), sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", name="uq_tuning_jobs_job_id"),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_tuning_jobs_tenant_idempotency"),
    )
    op.create_index("ix_tuning_jobs_tenant_id", "tuning_jobs", ["tenant_id"])
    op.create_index("ix_tuning_jobs_dataset_id", "tuning_jobs", ["dataset_id"])


def downgrade() -> None:
    op.drop_index("ix_tuning_jobs_dataset_id", table_name="tuning_jobs")
    op.drop_index("ix_tuning_jobs_tenant_id", table_name="tuning_jobs")
    op.drop_table("tuning_jobs")
