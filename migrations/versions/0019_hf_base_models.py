"""base models uploaded as Transformers checkpoints (format=hf)

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 15:00:00

A base model may now come as a zipped save_pretrained folder. The row says which format it was
uploaded in, the Transformers class it was saved from, its parameter count and the SHA-256 of
the archive as uploaded (the stored weights file, with the wrapper's tensor names, has its own), and
the tokenizer registered from the archive's tokenizer.json, if it held one.
Earlier rows are safetensors uploads of zoo architectures.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("base_models") as batch:
        batch.add_column(sa.Column("format", sa.String(length=16), nullable=False, server_default="safetensors"))
        batch.add_column(sa.Column("model_class", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("parameter_count", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("archive_sha256", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("tokenizer_id", sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("base_models") as batch:
        batch.drop_column("tokenizer_id")
        batch.drop_column("archive_sha256")
        batch.drop_column("parameter_count")
        batch.drop_column("model_class")
        batch.drop_column("format")
