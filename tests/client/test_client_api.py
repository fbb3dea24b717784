"""The Python client against the real app in-process: every endpoint, typed results, pagination,
problems as exceptions, and a tiny job trained by the worker's JobRunner until ``wait`` returns."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import httpx
import pytest

from privtrain import (
    BudgetExceeded,
    Client,
    Conflict,
    IntegrityError,
    InvalidRequest,
    NotFound,
    PrivtrainError,
    Unauthorized,
    WaitTimeout,
    build_job_spec,
)
from privtrain.resources import Dataset, Job
from privtrain_common.directed_rounding import format_guarantee
from tests.client.conftest import BASE_URL, AppTransport, WorkerThreads, tiny_spec, wrap
from tests.conftest import dp_sgd_spec


@pytest.fixture
def dataset(client: Client, digits_path: Path) -> Dataset:
    return client.upload_dataset(digits_path, epsilon=8, delta=1e-5)


def test_upload_from_a_path_infers_name_and_format(client: Client, digits_path: Path, digits_csv: bytes) -> None:
    dataset = client.upload_dataset(digits_path, epsilon=8, delta=1e-5)
    assert isinstance(dataset, Dataset)
    assert (dataset.name, dataset.format, dataset.n_rows, dataset.n_classes) == ("digits", "csv", 1437, 10)
    assert dataset.sha256 == hashlib.sha256(digits_csv).hexdigest()
    assert dataset.size_bytes == len(digits_csv)
    assert (dataset.budget.epsilon, dataset.budget.delta) == (8.0, 1e-5)
    assert dataset.created_at is not None and dataset.raw["links"]["budget"].endswith("/budget")
    assert client.get_dataset(dataset.id) == dataset


def test_upload_from_bytes_needs_a_name_and_format(client: Client, digits_csv: bytes) -> None:
    with pytest.raises(ValueError, match="format"):
        client.upload_dataset(digits_csv, name="d", epsilon=1, delta=1e-5)
    dataset = client.upload_dataset(digits_csv, name="from-bytes", format="csv", epsilon=1, delta=1e-5)
    assert dataset.name == "from-bytes" and dataset.n_rows == 1437


def test_lists_follow_every_page(client: Client, digits_csv: bytes, transport: AppTransport, api_key: str) -> None:
    lines = digits_csv.splitlines()
    ids = [  # one content, one dataset: each upload leaves out a different number of rows
        client.upload_dataset(
            b"\n".join(lines[: len(lines) - i]) + b"\n", name=f"d{i}", format="csv", epsilon=1, delta=1e-5
        ).id
        for i in range(3)
    ]
    pages: list[str] = []

    def count(request: httpx.Request, inner: httpx.BaseTransport) -> httpx.Response:
        pages.append(str(request.url))
        return inner.handle_request(request)

    with Client(BASE_URL, api_key, transport=wrap(transport, count)) as counting:
        listed = counting.list_datasets(page_size=2)
    assert [d.id for d in listed] == ids[::-1]  # newest first, all three
    assert len(pages) == 2 and "cursor=" in pages[1]


def test_budget_raise_and_ledger(client: Client, dataset: Dataset) -> None:
    budget = client.get_budget(dataset.id)
    assert (budget.epsilon, budget.remaining_epsilon, budget.entries) == (8.0, pytest.approx(8.0, abs=1e-5), 0)
    raised = client.raise_budget(dataset.id, epsilon=10, reason="more")
    assert raised.epsilon == 10.0 and raised.entries == 1
    job = client.submit(tiny_spec(dataset.id))
    client.cancel(job.id)
    entries = client.list_ledger(dataset.id, page_size=1)  # three pages of one entry
    assert [e.kind for e in entries] == ["ADJUST", "RESERVE", "RELEASE"]
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert entries[1].job_id == job.id and entries[1].prev_hash == entries[0].hash
    assert entries[0].details["reason"] == "more"
    with pytest.raises(InvalidRequest) as lowered:
        client.raise_budget(dataset.id, epsilon=5)
    assert lowered.value.slug == "invalid-budget" and lowered.value.status == 422


def test_catalogues(client: Client) -> None:
    algorithms = {a.name: a for a in client.list_algorithms()}
    assert "dp-sgd" in algorithms
    assert algorithms["dp-sgd"].defaults["clipping_norm"] == 1.0
    assert client.get_algorithm("dp-sgd") == algorithms["dp-sgd"]
    models = {m.name: m for m in client.list_models()}
    assert {"logistic-regression", "mlp"} <= set(models)
    assert "classification" in models["logistic-regression"].tasks
    with pytest.raises(NotFound):
        client.get_algorithm("no-such-algorithm")


def test_estimate_submit_list_show_cancel_events(client: Client, dataset: Dataset, dispatcher: WorkerThreads) -> None:
    spec = build_job_spec(
        dataset_id=dataset.id,
        model="logistic-regression",
        algorithm="dp-sgd",
        hyperparameters={"clipping_norm": 1.0, "momentum": 0.9},
        target_epsilon=4.0,
        epochs=2,
        batch_size=64,
        learning_rate=0.5,
    )
    assert spec == dp_sgd_spec(dataset.id)  # the builder writes exactly the API's document
    estimate = client.estimate(spec)
    assert estimate.admissible and estimate.steps == 45
    assert estimate.epsilon_reserved == pytest.approx(4.0, rel=1e-3)
    assert client.list_jobs() == []  # the estimate stored nothing

    job = client.submit(spec)
    assert isinstance(job, Job) and job.status == "queued" and not job.is_terminal
    assert job.steps_planned == 45 and job.noise_multiplier == pytest.approx(estimate.noise_multiplier)
    assert dispatcher.sent == [job.id]
    second = client.submit(tiny_spec(dataset.id))
    assert [j.id for j in client.list_jobs(page_size=1)] == [second.id, job.id]
    assert [j.id for j in client.list_jobs(status="queued", dataset_id=dataset.id)] == [second.id, job.id]
    assert client.get_job(job.id).spec["training"]["epochs"] == 2

    cancelled = client.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.is_terminal
    events = client.list_events(job.id, page_size=1)
    assert [e.kind for e in events] == ["queued", "cancelled"]
    assert client.list_events(job.id, after=events[0].seq) == events[1:]
    with pytest.raises(Conflict) as again:
        client.cancel(job.id)
    assert again.value.slug == "job-not-cancellable"
    with pytest.raises(Conflict) as no_model:
        client.get_report(second.id)
    assert no_model.value.type == "/problems/job-not-succeeded" and no_model.value.status == 409


def test_not_found_is_a_typed_problem(client: Client) -> None:
    with pytest.raises(NotFound) as caught:
        client.get_dataset("ds_missing")
    error = caught.value
    assert isinstance(error, PrivtrainError)
    assert (error.type, error.title, error.status) == ("/problems/not-found", "Not Found", 404)
    assert error.detail == "dataset not found"
    assert error.problem["instance"] == "/v1/datasets/ds_missing"
    with pytest.raises(NotFound):
        client.get_job("../datasets")  # an id is one path segment, never another route


def test_invalid_specs_raise_invalid_request_with_the_problem(client: Client, dataset: Dataset) -> None:
    bad = tiny_spec(dataset.id)
    bad["algorithm"]["hyperparameters"]["clipping_norm"] = -1
    with pytest.raises(InvalidRequest) as invalid:
        client.estimate(bad)
    assert invalid.value.type == "/problems/invalid-job-spec" and invalid.value.status == 422
    unknown = tiny_spec(dataset.id)
    unknown["extra_field"] = 1
    with pytest.raises(InvalidRequest) as validation:
        client.submit(unknown)
    assert validation.value.slug == "validation-error"
    assert validation.value.extra["errors"][0]["loc"][-1] == "extra_field"
    assert client.list_jobs() == []


def test_over_budget_is_budget_exceeded(client: Client, dataset: Dataset) -> None:
    with pytest.raises(BudgetExceeded) as caught:
        client.submit(tiny_spec(dataset.id, noise_multiplier=0.3))  # ε far above ε_G = 8
    assert isinstance(caught.value, Conflict)
    assert caught.value.type == "/problems/insufficient-privacy-budget"
    assert caught.value.remaining_epsilon == pytest.approx(8.0, abs=1e-5)
    largest = caught.value.largest_admissible_epsilon  # what a job of this shape is admitted at now
    assert largest is not None and 7.99 < largest < caught.value.extra["job_epsilon"]
    assert caught.value.extra["job_epsilon"] > 8.0
    assert client.list_jobs() == []


def test_a_bad_key_is_unauthorized(transport: AppTransport) -> None:
    with Client(BASE_URL, "pt_wrong", transport=transport) as stranger, pytest.raises(Unauthorized) as caught:
        stranger.list_datasets()
    assert caught.value.status == 401 and caught.value.slug == "unauthorized"


def test_wait_returns_the_finished_job_then_downloads_verify(
    client: Client, dataset: Dataset, dispatcher: WorkerThreads, tmp_path: Path, transport: AppTransport, api_key: str
) -> None:
    dispatcher.run = True
    job = client.submit(tiny_spec(dataset.id))
    bar = io.StringIO()
    done = client.wait(job.id, timeout=60, poll_interval=0.05, stream=bar)
    assert done.status == "succeeded", dispatcher.outcomes
    assert done.steps_run == done.steps_planned == 4
    final = bar.getvalue().splitlines()[-1]
    assert f"{job.id} [" in final and "4/4 steps" in final and final.endswith("succeeded")
    report = client.get_report(job.id)
    assert f"ε spent {format_guarantee(report['epsilon']['ledger'])}" in final  # rounded up, never down
    assert report["mechanism"]["steps_run"] == 4

    path = client.download_model(job.id, tmp_path)
    assert path == tmp_path / f"{job.id}.safetensors"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == report["model"]["sha256"]
    assert client.wait(job.id, timeout=1, progress=False).status == "succeeded"

    def flip_a_byte(request: httpx.Request, inner: httpx.BaseTransport) -> httpx.Response:
        response = inner.handle_request(request)
        if not request.url.path.endswith("/model"):
            return response
        body = bytearray(response.read())
        body[-1] ^= 1
        return httpx.Response(
            200, headers={"X-Content-SHA256": response.headers["x-content-sha256"]}, content=bytes(body)
        )

    out = tmp_path / "tampered"
    out.mkdir()
    with (
        Client(BASE_URL, api_key, transport=wrap(transport, flip_a_byte)) as tampered,
        pytest.raises(IntegrityError),
    ):
        tampered.download_model(job.id, out / "model.safetensors")
    assert list(out.iterdir()) == []  # no partial or corrupted model left behind

    cuts: list[int] = []

    def cut_mid_body(request: httpx.Request, inner: httpx.BaseTransport) -> httpx.Response:
        response = inner.handle_request(request)
        if not request.url.path.endswith("/model") or cuts:
            return response
        body = response.read()
        cuts.append(len(body))

        def half_then_reset():  # noqa: ANN202 - a byte stream
            yield body[: len(body) // 2]
            raise httpx.ReadError("connection reset")

        return httpx.Response(
            200, headers={"X-Content-SHA256": response.headers["x-content-sha256"]}, content=half_then_reset()
        )

    with Client(BASE_URL, api_key, transport=wrap(transport, cut_mid_body), sleep=lambda _s: None) as flaky:
        resumed = flaky.download_model(job.id, out / "model.safetensors")
    assert cuts and resumed.read_bytes() == path.read_bytes()  # fetched again whole, not half
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]


def test_wait_times_out_on_a_job_nobody_runs(client: Client, dataset: Dataset) -> None:
    job = client.submit(tiny_spec(dataset.id))
    with pytest.raises(WaitTimeout, match="still queued"):
        client.wait(job.id, timeout=0.1, poll_interval=0.02, progress=False)


def test_uploading_registered_bytes_raises_already_registered(client: Client, digits_csv: bytes) -> None:
    from privtrain import AlreadyRegistered

    first = client.upload_dataset(digits_csv, name="first", format="csv", epsilon=1, delta=1e-5)
    with pytest.raises(AlreadyRegistered) as refused:
        client.upload_dataset(digits_csv, name="second", format="csv", epsilon=1, delta=1e-5)
    assert refused.value.status == 409 and refused.value.existing_dataset_id == first.id
