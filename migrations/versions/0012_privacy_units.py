"""a dataset's privacy unit column and its number of units (user-level privacy)

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Datasets registered before have no unit column: their privacy unit is one row, as before.
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.add_column(sa.Column("privacy_unit_column", sa.String(200), nullable=True))
        batch.add_column(sa.Column("n_units", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.drop_column("n_units")
        batch.drop_column("privacy_unit_column")
