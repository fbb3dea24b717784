"""a running tuning's trial queue, shared by the workers that run its trials in parallel

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_trials",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("candidate", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("model_file", sa.String(200), nullable=True),
        sa.UniqueConstraint("job_id", "attempt", "seq", name="uq_tuning_trials_job_attempt_seq"),
    )
    op.create_index("ix_tuning_trials_job_id", "tuning_trials", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_tuning_trials_job_id", table_name="tuning_trials")
    op.drop_table("tuning_trials")
