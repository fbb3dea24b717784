"""privtrain-admin run where there is no (migrated) database says where it looked and how to point
elsewhere, exits non-zero, and leaves no traceback and no stray database file behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command

from admin.cli import EXIT_NO_DATABASE, main
from kernel.bootstrap import alembic_config, migrate, migration_head
from kernel.config import get_settings

ADMIN = Path(sys.executable).with_name("privtrain-admin")


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with no data directory, and no PRIVTRAIN_* pointing anywhere."""
    for name in [name for name in os.environ if name.startswith("PRIVTRAIN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PRIVTRAIN_ENVIRONMENT", "test")
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


@pytest.mark.parametrize(
    "args", [["list-keys"], ["create-key"], ["revoke-key", "pt_x"], ["verify-ledger"], ["reconcile"]]
)
def test_no_database_here_names_where_it_looked(
    elsewhere: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert main(args) == EXIT_NO_DATABASE
    err = capsys.readouterr().err
    data_dir = elsewhere.resolve() / ".privtrain"
    assert f"privtrain-admin {args[0]}: there is no privtrain database here" in err
    assert f"data directory: {data_dir}" in err
    assert f"sqlite:///{data_dir / 'privtrain.db'}" in err
    assert "PRIVTRAIN_DATA_DIR=/path/to/.privtrain" in err and "PRIVTRAIN_DATABASE_URL" in err
    assert not data_dir.exists()  # looking did not create an empty database


def test_a_database_that_was_never_migrated_says_so(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (elsewhere / ".privtrain").mkdir()
    (elsewhere / ".privtrain" / "privtrain.db").touch()
    assert main(["list-keys"]) == EXIT_NO_DATABASE
    assert "holds no privtrain tables (it was never migrated)" in capsys.readouterr().err


def test_an_old_schema_names_both_revisions(elsewhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = get_settings()
    settings.data_dir.mkdir()
    command.upgrade(alembic_config(settings.resolved_database_url), "0001")
    assert main(["verify-ledger"]) == EXIT_NO_DATABASE
    err = capsys.readouterr().err
    assert f"the database is at migration 0001, this version needs {migration_head()}" in err
    assert "privtrain-admin migrate" in err


def test_pointing_at_the_data_directory_works(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = elsewhere / "service-data"
    monkeypatch.setenv("PRIVTRAIN_DATA_DIR", str(data_dir))
    get_settings.cache_clear()
    migrate(get_settings())
    assert main(["create-key", "--tenant", "carol"]) == 0
    assert capsys.readouterr().out.startswith("pt_")


def test_an_unreachable_server_hides_the_password(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRIVTRAIN_DATABASE_URL", "postgresql+psycopg://admin:s3cret@127.0.0.1:1/privtrain")
    get_settings.cache_clear()
    assert main(["list-keys"]) == EXIT_NO_DATABASE
    err = capsys.readouterr().err
    assert "cannot open the database" in err
    assert "postgresql+psycopg://admin:***@127.0.0.1:1/privtrain  (from PRIVTRAIN_DATABASE_URL)" in err
    assert "s3cret" not in err


def test_the_installed_command_exits_non_zero_without_a_traceback(elsewhere: Path) -> None:
    executable = [str(ADMIN)] if ADMIN.exists() else [sys.executable, "-m", "admin.cli"]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PRIVTRAIN_")}
    result = subprocess.run(
        [*executable, "list-keys"],
        cwd=elsewhere,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_NO_DATABASE
    assert "Traceback" not in result.stderr and "sqlalchemy" not in result.stderr.lower()
    assert str(elsewhere.resolve() / ".privtrain") in result.stderr
    assert len(result.stderr.splitlines()) < 12
