"""Per-job event numbers on PostgreSQL: worker threads writing progress events while the API (real
HTTP, uvicorn) cancels the job never number two events alike, and the numbers have no gap."""

from __future__ import annotations

import pytest

from kernel.bootstrap import migrate
from tests.concurrency_helpers import concurrency_settings, digits_csv, live_server
from tests.conftest import dp_sgd_spec
from tests.event_seq_race import race_event_writers

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]


def test_concurrent_cancel_and_progress_events_get_distinct_gapless_numbers(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str
) -> None:
    settings = concurrency_settings(tmp_path_factory.mktemp("event-seq-postgres") / "data", database_url=postgres_url)
    assert settings.resolved_database_url.startswith("postgresql")
    migrate(settings)
    # The PostgreSQL database is shared by the session's service tests: a tenant of its own, so
    # no other test has registered these bytes for it already (one content, one budget).
    with live_server(settings) as live, live.client(live.tenant_key("event-seq-owner")) as client:
        dataset = client.post(
            "/v1/datasets",
            content=digits_csv(),
            params={"name": "digits", "format": "csv", "label_column": "label", "epsilon": 8, "delta": 1e-5},
        )
        assert dataset.status_code == 201, dataset.text
        jobs = [client.post("/v1/jobs", json=dp_sgd_spec(dataset.json()["id"], target_epsilon=1.0)) for _ in range(2)]
        assert [job.status_code for job in jobs] == [202, 202], jobs[0].text
        first, second = (job.json()["id"] for job in jobs)
        race_event_writers(live.db, first, cancel=lambda: client.post(f"/v1/jobs/{first}/cancel").status_code)
        untouched = client.get(f"/v1/jobs/{second}/events").json()
        assert [event["seq"] for event in untouched] == list(range(1, len(untouched) + 1)), "numbered per job"
