"""datasets record their public class list (and whether the owner declared it); uploads look up
content per tenant

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Datasets registered before this revision keep NULL: their class list is 0..n_classes-1,
    # taken from the labels found (the API shows it as "observed").
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("class_names", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("classes_declared", sa.Boolean(), nullable=False, server_default=sa.false()))
    # Uploads look up "does this tenant already hold these bytes?" (one content, one budget).
    op.create_index("ix_datasets_tenant_sha256", "datasets", ["tenant_id", "sha256"])


def downgrade() -> None:
    op.drop_index("ix_datasets_tenant_sha256", table_name="datasets")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("classes_declared")
        batch.drop_column("class_names")
