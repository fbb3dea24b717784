"""whether a person-level dataset's exact row count is public (the owner's declaration at upload)

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 12:00:00

On a dataset with a privacy unit column the exact row count is a function of the rows: removing a
unit changes it by that unit's row count. It is shown to the owner only unless the owner declares
it public at upload. Datasets registered before had it shown to their analysts; from now on they
withhold it (the conservative reading: their owners never declared it). Row-level datasets are
unchanged: there the row count is the number of units, public by design.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.add_column(sa.Column("n_rows_public", sa.Boolean(), nullable=False, server_default=sa.true()))
    datasets = sa.table(
        "datasets", sa.column("privacy_unit_column", sa.String()), sa.column("n_rows_public", sa.Boolean())
    )
    op.execute(datasets.update().where(datasets.c.privacy_unit_column.is_not(None)).values(n_rows_public=False))


def downgrade() -> None:
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.drop_column("n_rows_public")
