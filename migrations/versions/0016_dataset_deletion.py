"""dataset deletion (status, tombstone times, the owner's choice for models), the content digest,
and the log of erased blobs

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 10:00:00

Datasets registered before get ``content_digest`` NULL: the migration cannot parse their stored
uploads in SQL. Until ``privtrain-admin content-digests`` computes it (or their deletion does,
before the upload is erased), their content is recognised by the SHA-256 of the uploaded bytes,
as before (docs/privacy-model.md, "One content, one budget").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # recreate="never": plain ALTER TABLE on SQLite too (jobs and grants point at datasets).
    with op.batch_alter_table("datasets", recreate="never") as batch:
        batch.add_column(sa.Column("content_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("status", sa.String(16), nullable=False, server_default="active"))
        batch.add_column(sa.Column("deletion_requested_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("delete_models", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_datasets_tenant_content_digest", "datasets", ["tenant_id", "content_digest"])
    op.create_table(
        "erased_blobs",
        sa.Column("key", sa.String(200), nullable=False),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_erased_blobs")),
    )


def downgrade() -> None:
    # Without the status column a tombstone would read as a live dataset whose files are missing:
    # refuse, rather than resurrect what owners deleted.
    deleted = op.get_bind().execute(sa.text("SELECT COUNT(*) FROM datasets WHERE status <> 'active'")).scalar()
    if deleted:
        raise RuntimeError(
            f"{deleted} dataset(s) are deleted or being deleted; this version cannot represent them, "
            "so the migration is not undone"
        )
    op.drop_table("erased_blobs")
    op.drop_index("ix_datasets_tenant_content_digest", table_name="datasets")
    with op.batch_alter_table("datasets", recreate="never") as batch:  # SQLite ≥ 3.35 drops columns in place
        batch.drop_column("delete_models")
        batch.drop_column("deleted_at")
        batch.drop_column("deletion_requested_at")
        batch.drop_column("status")
        batch.drop_column("content_digest")
