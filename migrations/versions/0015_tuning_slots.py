"""a running tuning's public slots: one fixed stretch of worker time per possible trial

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_slots",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(40), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("job_id", "attempt", "slot", name="uq_tuning_slots_job_attempt_slot"),
    )
    op.create_index("ix_tuning_slots_job_id", "tuning_slots", ["job_id"])
    op.create_index("ix_tuning_slots_state", "tuning_slots", ["state"])
    with op.batch_alter_table("tuning_trials") as batch:
        batch.add_column(sa.Column("device", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuning_trials") as batch:
        batch.drop_column("device")
    op.drop_index("ix_tuning_slots_state", table_name="tuning_slots")
    op.drop_index("ix_tuning_slots_job_id", table_name="tuning_slots")
    op.drop_table("tuning_slots")
