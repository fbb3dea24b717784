"""image datasets (modality, decoded uint8 array), public datasets (no budget, no ledger), and
public base models (pretrained weights a job may start from)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 05:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # recreate="never": plain ALTER TABLE on SQLite too (jobs and grants point at datasets).
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.add_column(sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column("modality", sa.String(16), nullable=False, server_default="tabular"))
        batch.add_column(sa.Column("array_blob_key", sa.String(200), nullable=True))
    op.create_table(
        "base_models",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("architecture", sa.String(64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("input_shape", sa.JSON(), nullable=False),
        sa.Column("n_outputs", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("blob_key", sa.String(200), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_base_models_tenant_idempotency"),
    )
    op.create_index("ix_base_models_tenant_sha256", "base_models", ["tenant_id", "sha256"])


def downgrade() -> None:
    op.drop_index("ix_base_models_tenant_sha256", table_name="base_models")
    op.drop_table("base_models")
    with op.batch_alter_table("datasets", recreate="never") as batch:  # SQLite ≥ 3.35 drops columns in place
        batch.drop_column("array_blob_key")
        batch.drop_column("modality")
        batch.drop_column("public")
