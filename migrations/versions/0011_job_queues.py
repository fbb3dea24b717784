"""the worker queue of each job (GPU, CPU or a named class), fixed at admission

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # recreate="never": plain ALTER TABLE on SQLite too. Jobs admitted before have no queue: they
    # are sent to the GPU queue (PRIVTRAIN_TASK_QUEUE), as before.
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.add_column(sa.Column("queue", sa.String(40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:  # SQLite ≥ 3.35 drops columns in place
        batch.drop_column("queue")
