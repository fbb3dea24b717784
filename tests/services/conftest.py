"""Redis + PostgreSQL fixtures: skip with a reason when unconfigured, fail instead under CI=true."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url


def _require(name: str) -> str:
    value = os.environ.get(name)
    if value:
        return value
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} must be set when CI=true: service tests may not skip in CI")
    pytest.skip(f"{name} is not set; service tests need Redis and PostgreSQL")


def redis_database_of_this_process(url: str) -> str:
    """``url`` with one Redis database per pytest-xdist process: the configured one for ``gw0``
    and the next lower ones for ``gw1``, ``gw2``, … Two processes on one database would flush it
    under each other, and one's Celery workers would take the other's tasks."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) - int(worker.removeprefix("gw"))
    if database < 0:
        pytest.fail(f"{url} leaves no Redis database for pytest-xdist process {worker}; configure a higher one")
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = redis_database_of_this_process(_require("PRIVTRAIN_TEST_REDIS_URL"))
    import redis

    client = redis.Redis.from_url(url)
    client.ping()
    client.flushdb()
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database per test session, created from the configured one and dropped after."""
    base = _require("PRIVTRAIN_TEST_DATABASE_URL")
    name = f"privtrain_test_{secrets.token_hex(4)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
