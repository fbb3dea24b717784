"""Concurrent admission on the embedded SQLite database (WAL, BEGIN IMMEDIATE) over real HTTP.

docs/privacy-model.md#ledger: admission is one write transaction; 60 racing submissions against a budget that
fits exactly k of them admit exactly k and never overspend.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernel.bootstrap import migrate
from kernel.config import Settings
from tests.concurrency_helpers import (
    LiveService,
    concurrency_settings,
    live_server,
    run_duplicate_upload_race,
    run_idempotent_race,
    run_single_dataset_race,
    run_two_dataset_race,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def sqlite_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    settings = concurrency_settings(tmp_path_factory.mktemp("concurrency-sqlite") / "data")
    assert settings.resolved_database_url.startswith("sqlite")
    migrate(settings)
    return settings


@pytest.fixture
def live(sqlite_settings: Settings) -> Iterator[LiveService]:
    with live_server(sqlite_settings) as service:
        yield service


def test_sixty_concurrent_submissions_admit_exactly_k(live: LiveService) -> None:
    run_single_dataset_race(live)


def test_two_datasets_race_independently(live: LiveService) -> None:
    run_two_dataset_race(live)


def test_same_idempotency_key_under_concurrency_makes_one_job(live: LiveService) -> None:
    run_idempotent_race(live)


def test_concurrent_uploads_of_the_same_bytes_register_one_dataset(live: LiveService) -> None:
    run_duplicate_upload_race(live)
