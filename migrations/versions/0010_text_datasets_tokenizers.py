"""text datasets (tokenizer, vocabulary size, pad id and text field of a JSON Lines upload) and
public tokenizers (uploaded tokenizer.json files, or trained on a public text dataset)

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # recreate="never": plain ALTER TABLE on SQLite too (jobs and grants point at datasets).
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.add_column(sa.Column("tokenizer_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("vocab_size", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pad_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("text_field", sa.String(200), nullable=True))
    op.create_table(
        "tokenizers",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("tenant_id", sa.String(40), sa.ForeignKey("tenants.id"), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("blob_key", sa.String(200), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("vocab_size", sa.Integer(), nullable=False),
        sa.Column("pad_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("trained_from_dataset_id", sa.String(40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_tokenizers_tenant_sha256", "tokenizers", ["tenant_id", "sha256"])


def downgrade() -> None:
    op.drop_index("ix_tokenizers_tenant_sha256", table_name="tokenizers")
    op.drop_table("tokenizers")
    with op.batch_alter_table("datasets", recreate="never") as batch:  # SQLite ≥ 3.35 drops columns in place
        batch.drop_column("text_field")
        batch.drop_column("pad_id")
        batch.drop_column("vocab_size")
        batch.drop_column("tokenizer_id")
