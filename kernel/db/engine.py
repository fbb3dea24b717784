"""Database engine and sessions.

SQLite runs in WAL mode with foreign keys on, and admission uses ``BEGIN IMMEDIATE`` so that two
writers can never both read the same budget (docs/privacy-model.md#ledger); PostgreSQL uses ``SELECT … FOR UPDATE``
on the budget row instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A request may hold its read session's connection while it opens a write transaction, so the
# pool must hold more connections than there are request threads (Starlette's default: 40), or
# a burst of submissions deadlocks waiting for second connections.
POOL_SIZE = 20
POOL_MAX_OVERFLOW = 40
# An unreachable server must give a quick 503, never a hung request (psycopg's connect_timeout
# is in whole seconds; the pool wait bounds a request that finds every connection busy).
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str) -> Engine:
    """Create an engine; SQLite gets WAL, foreign keys and explicit transaction control."""
    if not is_sqlite(url):
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=POOL_SIZE,
            max_overflow=POOL_MAX_OVERFLOW,
            pool_timeout=POOL_TIMEOUT_S,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
            future=True,
        )
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        pool_size=POOL_SIZE,
        max_overflow=POOL_MAX_OVERFLOW,
        future=True,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy (not pysqlite) emit BEGIN, so that we can choose BEGIN IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        immediate = connection.get_execution_options().get("sqlite_immediate", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Database:
    """Owns the engine and hands out sessions; one per process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._locking_sessions = sessionmaker(
            self.engine.execution_options(sqlite_immediate=True), expire_on_commit=False
        )

    @property
    def sqlite(self) -> bool:
        return is_sqlite(self.url)

    def session(self) -> Session:
        return self._sessions()

    @contextmanager
    def write_transaction(self) -> Iterator[Session]:
        """A transaction that serialises with every other writer on SQLite (BEGIN IMMEDIATE).

        On PostgreSQL it is an ordinary transaction; callers lock rows with ``with_for_update``.
        """
        session = self._locking_sessions()
        try:
            with session.begin():
                yield session
        finally:
            session.close()

    @contextmanager
    def read_session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()
