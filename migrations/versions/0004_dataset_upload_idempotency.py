"""dataset uploads accept an Idempotency-Key (a retried upload registers one dataset, one budget)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 23:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("request_hash", sa.String(length=64), nullable=True))
        batch.create_unique_constraint("uq_datasets_tenant_idempotency", ["tenant_id", "idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_constraint("uq_datasets_tenant_idempotency", type_="unique")
        batch.drop_column("request_hash")
        batch.drop_column("idempotency_key")
