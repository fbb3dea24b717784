"""Models and migrations agree (SQLite here; PostgreSQL in tests/services), and migrations reverse."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text

from kernel.bootstrap import alembic_config, migrate
from kernel.db.engine import Database
from tests.conftest import make_settings


def test_sqlite_models_match_migrations(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    migrate(settings)
    command.check(alembic_config(settings.resolved_database_url))  # raises on any difference


def test_downgrade_to_base_and_back(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    migrate(settings)
    config = alembic_config(settings.resolved_database_url)
    command.downgrade(config, "base")
    db = Database(settings.resolved_database_url)
    assert set(inspect(db.engine).get_table_names()) == {"alembic_version"}
    db.dispose()
    command.upgrade(config, "head")
    db = Database(settings.resolved_database_url)
    assert {"jobs", "ledger_entries", "privacy_budgets"} <= set(inspect(db.engine).get_table_names())
    db.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    migrate(settings)
    db = Database(settings.resolved_database_url)
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    db.dispose()


def test_downgrade_below_deletions_refuses_to_resurrect_deleted_datasets(tmp_path: Path) -> None:
    """Before 0016 a tombstone would read as a live dataset whose files are missing."""
    settings = make_settings(tmp_path)
    migrate(settings)
    db = Database(settings.resolved_database_url)
    with db.write_transaction() as tx:
        tx.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('tn_1', 't', CURRENT_TIMESTAMP)"))
        tx.execute(
            text(
                "INSERT INTO datasets (id, tenant_id, name, format, sha256, blob_key, size_bytes, n_rows, "
                "feature_shape, n_features, task, created_at, status) VALUES ('ds_1', 'tn_1', 'd', 'csv', 'x', "
                "'sha256/x', 1, 1, '[1]', 1, 'regression', CURRENT_TIMESTAMP, 'deleted')"
            )
        )
    db.dispose()
    with pytest.raises(RuntimeError, match="deleted or being deleted"):
        command.downgrade(alembic_config(settings.resolved_database_url), "0014")
