"""Retries: which failures are retried, how long the client waits, and that a retried submission
carries the same Idempotency-Key so the server replays it instead of reserving budget twice."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kernel.config import Settings
from privtrain import Client, InvalidRequest, RateLimited, ServerError, TransportError
from privtrain.resources import Dataset
from privtrain.retry import RetryPolicy, parse_retry_after
from tests.client.conftest import BASE_URL, AppTransport, recording_sleep, tiny_spec, wrap

Handler = Callable[[httpx.Request, httpx.BaseTransport], httpx.Response]


class FailFirst:
    """Fails the first ``len(failures)`` requests matching ``path`` (an HTTP status or an
    exception each), optionally after the app has handled them; records every request seen."""

    def __init__(
        self,
        path: str,
        failures: list[int | Exception],
        *,
        after_app: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.path, self.failures, self.after_app = path, list(failures), after_app
        self.headers = headers or {}
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request, inner: httpx.BaseTransport) -> httpx.Response:
        if request.url.path != self.path:
            return inner.handle_request(request)
        self.seen.append(request)
        if not self.failures:
            return inner.handle_request(request)
        failure = self.failures.pop(0)
        if self.after_app:
            inner.handle_request(request)  # the server acts, then the answer is lost
        if isinstance(failure, Exception):
            raise failure
        return httpx.Response(failure, headers=self.headers, text="<html>bad gateway</html>")


@pytest.fixture
def make_client(transport: AppTransport, api_key: str, sleeps: list[float]) -> Callable[..., Client]:
    def make(handler: Handler, *, max_retries: int = 3) -> Client:
        return Client(
            BASE_URL,
            api_key,
            max_retries=max_retries,
            transport=wrap(transport, handler),
            sleep=recording_sleep(sleeps),
        )

    return make


@pytest.fixture
def dataset(client: Client, digits_csv: bytes) -> Dataset:
    return client.upload_dataset(digits_csv, name="digits", format="csv", epsilon=8, delta=1e-5)


def test_a_submission_whose_answer_was_lost_is_replayed_not_charged_twice(
    make_client: Callable[..., Client], client: Client, dataset: Dataset, sleeps: list[float]
) -> None:
    flaky = FailFirst("/v1/jobs", [503], after_app=True)
    job = make_client(flaky).submit(tiny_spec(dataset.id))
    keys = [r.headers["Idempotency-Key"] for r in flaky.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) >= 32
    assert [j.id for j in client.list_jobs()] == [job.id]  # admitted once
    assert [e.kind for e in client.list_ledger(dataset.id)] == ["RESERVE"]
    assert sleeps == [0.5]
    other = FailFirst("/v1/jobs", [])
    make_client(other).submit(tiny_spec(dataset.id, noise_multiplier=4.0))
    assert other.seen[0].headers["Idempotency-Key"] != keys[0]  # a fresh key per submit call


def test_a_caller_key_makes_a_resubmission_safe(client: Client, dataset: Dataset) -> None:
    first = client.submit(tiny_spec(dataset.id), idempotency_key="nightly-2026-11-21")
    again = client.submit(tiny_spec(dataset.id), idempotency_key="nightly-2026-11-21")
    assert again.id == first.id and len(client.list_jobs()) == 1


def test_reads_retry_on_connection_errors_and_gateway_statuses_with_backoff(
    make_client: Callable[..., Client], dataset: Dataset, sleeps: list[float]
) -> None:
    path = f"/v1/datasets/{dataset.id}"
    flaky = FailFirst(path, [httpx.ConnectError("refused"), 502, httpx.ReadTimeout("slow")])
    assert make_client(flaky).get_dataset(dataset.id).id == dataset.id
    assert len(flaky.seen) == 4 and sleeps == [0.5, 1.0, 2.0]


def test_retries_are_bounded(make_client: Callable[..., Client], dataset: Dataset, sleeps: list[float]) -> None:
    flaky = FailFirst(f"/v1/datasets/{dataset.id}/budget", [504] * 5)
    with pytest.raises(ServerError) as caught:
        make_client(flaky, max_retries=2).get_budget(dataset.id)
    assert caught.value.status == 504 and caught.value.type is None
    assert "bad gateway" in caught.value.detail  # a non-problem body is kept as the detail
    assert len(flaky.seen) == 3 and len(sleeps) == 2
    down = FailFirst("/v1/algorithms", [httpx.ConnectError("refused")] * 5)
    with pytest.raises(TransportError, match="ConnectError"):
        make_client(down, max_retries=1).list_algorithms()


def test_429_honours_retry_after(
    make_client: Callable[..., Client], transport: AppTransport, api_key: str, sleeps: list[float]
) -> None:
    flaky = FailFirst("/v1/models", [429], headers={"Retry-After": "7"})
    assert make_client(flaky).list_models()
    assert sleeps == [7.0]
    always = FailFirst("/v1/models", [429] * 3, headers={"Retry-After": "0"})
    with pytest.raises(RateLimited):
        make_client(always, max_retries=1).list_models()
    assert len(always.seen) == 2
    # a server that asks for more than retry_after_max (60 s) is not waited for
    sleeps.clear()
    busy = FailFirst("/v1/models", [429], headers={"Retry-After": "3600"})
    with pytest.raises(RateLimited):
        make_client(busy).list_models()
    assert sleeps == [] and len(busy.seen) == 1


def test_the_active_job_cap_is_rate_limited_and_retried(
    transport: AppTransport,
    api_key: str,
    dataset: Dataset,
    settings: Settings,
    sleeps: list[float],
) -> None:
    """The server's own 429 (too-many-active-jobs, Retry-After: 30): retried, then raised."""
    notices = []
    settings.max_active_jobs_per_tenant = 1
    with Client(
        BASE_URL, api_key, max_retries=1, transport=transport, sleep=recording_sleep(sleeps), on_retry=notices.append
    ) as capped:
        capped.submit(tiny_spec(dataset.id))
        with pytest.raises(RateLimited) as caught:
            capped.submit(tiny_spec(dataset.id, noise_multiplier=4.0))
    assert caught.value.slug == "too-many-active-jobs" and caught.value.status == 429
    assert sleeps == [30.0]
    assert [(n.method, n.path, n.attempt, n.delay, n.reason) for n in notices] == [
        ("POST", "/v1/jobs", 1, 30.0, "HTTP 429")
    ]


def test_a_retried_upload_registers_one_dataset(
    make_client: Callable[..., Client], client: Client, digits_csv: bytes, sleeps: list[float]
) -> None:
    """A 502 after the server registered the upload: the retry carries the same Idempotency-Key
    and gets the dataset back, so there is one dataset with one budget, not two."""
    gateway = FailFirst("/v1/datasets", [502], after_app=True)
    dataset = make_client(gateway).upload_dataset(digits_csv, name="d", format="csv", epsilon=1, delta=1e-5)
    keys = [r.headers["Idempotency-Key"] for r in gateway.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and sleeps == [0.5]
    assert [d.id for d in client.list_datasets()] == [dataset.id]
    assert client.list_ledger(dataset.id) == []  # one budget, nothing spent
    with pytest.raises(InvalidRequest) as reused:  # the same key for a different upload
        client.upload_dataset(digits_csv, name="other", format="csv", epsilon=1, delta=1e-5, idempotency_key=keys[0])
    assert reused.value.slug == "idempotency-key-reused"
    assert len(client.list_datasets()) == 1


def test_a_streamed_file_upload_is_resent_whole(
    make_client: Callable[..., Client],
    digits_path: Path,
    digits_csv: bytes,
) -> None:
    refused = FailFirst("/v1/datasets", [httpx.ConnectError("refused")])
    dataset = make_client(refused).upload_dataset(digits_path, epsilon=1, delta=1e-5)
    assert dataset.size_bytes == len(digits_csv) and len(refused.seen) == 2
    assert refused.seen[-1].headers["Content-Length"] == str(len(digits_csv))


def test_backoff_and_retry_after_parsing() -> None:
    policy = RetryPolicy(max_retries=10, backoff_base=0.5, backoff_max=4.0, retry_after_max=60)
    assert [policy.backoff(i) for i in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.delay(0, httpx.Response(429, headers={"Retry-After": "3600"})) is None
    assert policy.delay(0, httpx.Response(429, headers={"Retry-After": "60"})) == 60
    assert policy.delay(2, httpx.Response(503)) == 2.0
    now = dt.datetime(2026, 11, 21, 12, 0, 0, tzinfo=dt.UTC)
    assert parse_retry_after("Sat, 21 Nov 2026 12:00:30 GMT", now=now) == 30.0
    assert parse_retry_after("Sat, 21 Nov 2026 11:00:00 GMT", now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert not policy.should_retry_status(502, replay_safe=False)
    assert policy.should_retry_status(429, replay_safe=False)
    assert not policy.should_retry_status(500, replay_safe=True)  # a server bug is not transient
