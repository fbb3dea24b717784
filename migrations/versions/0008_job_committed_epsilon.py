"""jobs record the ε they actually committed (stopped-early and cancelled jobs spend less than
they reserved)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from kernel.privacy import ORDERS, ORDERS_VERSION, ledger_epsilon

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_FINISHED = ("succeeded", "failed", "cancelled")

# Lightweight table stubs: a migration must not follow later changes to kernel.db.orm.
_jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("status", sa.String),
    sa.column("delta", sa.Float),
    sa.column("epsilon_committed", sa.Float),
)
_entries = sa.table(
    "ledger_entries",
    sa.column("job_id", sa.String),
    sa.column("kind", sa.String),
    sa.column("curve", sa.JSON),
    sa.column("orders_version", sa.String),
)


def _committed_epsilon(curve: Sequence[float] | None, orders_version: str, delta: float) -> float | None:
    """Ledger ε of a COMMIT curve at the job's δ, as ``kernel.ledger.operations.commit`` now records it.

    A curve on another orders grid cannot be converted with today's orders: left NULL, and such a
    job keeps showing its reserved ε (the safe side) rather than a guessed spend.
    """
    if curve is None or orders_version != ORDERS_VERSION or len(curve) != len(ORDERS):
        return None
    if not any(curve):
        return 0.0
    return ledger_epsilon(tuple(curve), delta)


def upgrade() -> None:
    # recreate="never": plain ALTER TABLE on SQLite too. Rebuilding ``jobs`` would drop a table that
    # job_events and ledger_entries point at, which SQLite's foreign keys refuse once jobs exist.
    with op.batch_alter_table("jobs", recreate="never") as batch:
        batch.add_column(sa.Column("epsilon_committed", sa.Float(), nullable=True))
    connection = op.get_bind()
    finished = connection.execute(sa.select(_jobs.c.id, _jobs.c.delta).where(_jobs.c.status.in_(_FINISHED))).all()
    for job_id, delta in finished:
        settled = connection.execute(
            sa.select(_entries.c.kind, _entries.c.curve, _entries.c.orders_version).where(
                _entries.c.job_id == job_id, _entries.c.kind.in_(("COMMIT", "RELEASE"))
            )
        ).all()
        commits = [row for row in settled if row.kind == "COMMIT"]
        if commits:
            value = _committed_epsilon(commits[0].curve, commits[0].orders_version, delta)
        elif settled:  # released whole, before the data was opened: nothing spent
            value = 0.0
        else:  # finished without settlement (should not happen): no spend to state
            value = None
        if value is not None:
            connection.execute(sa.update(_jobs).where(_jobs.c.id == job_id).values(epsilon_committed=value))


def downgrade() -> None:
    with op.batch_alter_table("jobs", recreate="never") as batch:  # SQLite ≥ 3.35 drops columns in place
        batch.drop_column("epsilon_committed")
