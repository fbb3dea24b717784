"""First-start conveniences: migrations and the bootstrap API key."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config

from kernel.access.keys import DEFAULT_TENANT, generate_api_key, get_or_create_tenant, register_api_key
from kernel.config import Settings
from kernel.db.engine import Database

REPO_ROOT = Path(__file__).resolve().parent.parent
KEY_FILE_NAME = "api-key"


def alembic_config(database_url: str) -> Config:
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


@lru_cache(maxsize=1)
def migration_head() -> str:
    """The newest migration revision this code ships (read once from the scripts)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


def migrate(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings.resolved_database_url), "head")


def register_bootstrap_key(db: Database, key: str, *, tenant: str = DEFAULT_TENANT) -> None:
    with db.write_transaction() as session:
        register_api_key(session, tenant=get_or_create_tenant(session, tenant), key=key, label="bootstrap")


def ensure_embedded_key(settings: Settings, db: Database) -> tuple[str, Path]:
    """Generate the embedded mode's key once (digest in the DB, key in a 0600 file) and return it."""
    path = settings.data_dir / KEY_FILE_NAME
    if path.exists():
        key = path.read_text().strip()
    else:
        key = generate_api_key()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(key + "\n")
    register_bootstrap_key(db, key)
    return key, path
