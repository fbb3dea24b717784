"""datasets record the owner's declared data preparation (dropped columns, one-hot categories,
feature scaling, how labels match the class list)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

import math

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

datasets = sa.table(
    "datasets",
    sa.column("id", sa.String()),
    sa.column("class_names", sa.JSON()),
    sa.column("classes_declared", sa.Boolean()),
    sa.column("preparation", sa.JSON()),
)


def _is_number(name: str) -> bool:
    try:
        return math.isfinite(float(name))
    except ValueError:
        return False


def upgrade() -> None:
    # NULL: nothing declared, the features are used as uploaded (every dataset registered before).
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("preparation", sa.JSON(), nullable=True))
    # Labels now match a declared class list by name. Before, a label was always an index into it;
    # where a declared name is a number the two differ (classes=1,2: label 1 was "2", by name it is
    # "1"), so those datasets keep their meaning explicitly: "labels": "indices".
    bind = op.get_bind()
    declared = bind.execute(
        sa.select(datasets.c.id, datasets.c.class_names).where(datasets.c.classes_declared.is_(True))
    ).all()
    for dataset_id, names in declared:
        if names and any(_is_number(str(name)) for name in names):
            bind.execute(datasets.update().where(datasets.c.id == dataset_id).values(preparation={"labels": "indices"}))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("preparation")
