"""Concurrent admission on PostgreSQL (SELECT … FOR UPDATE on the budget row) over real HTTP.

docs/privacy-model.md#ledger: admission is one transaction holding the dataset's budget row lock; 60 racing
submissions against a budget that fits exactly k of them admit exactly k and never overspend.
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

pytestmark = [pytest.mark.services, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def pg_settings(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Settings:
    settings = concurrency_settings(tmp_path_factory.mktemp("concurrency-postgres") / "data", database_url=postgres_url)
    assert settings.resolved_database_url.startswith("postgresql")
    migrate(settings)
    return settings


@pytest.fixture
def live(pg_settings: Settings) -> Iterator[LiveService]:
    with live_server(pg_settings) as service:
        yield service


def test_sixty_concurrent_submissions_admit_exactly_k(live: LiveService) -> None:
    run_single_dataset_race(live)


def test_two_datasets_race_independently(live: LiveService) -> None:
    run_two_dataset_race(live)


def test_same_idempotency_key_under_concurrency_makes_one_job(live: LiveService) -> None:
    run_idempotent_race(live)


def test_concurrent_uploads_of_the_same_bytes_register_one_dataset(live: LiveService) -> None:
    run_duplicate_upload_race(live)
