"""The report's single-job ε is computed while the job trains and used when the job ran as planned."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

import kernel.reporting.released_report as released_report_module
import worker.runner as runner_module
import worker.single_job_prefetch as prefetch_module
from kernel import privacy
from kernel.config import Settings
from kernel.db.engine import Database
from tests.api.worker_jobs import run_on_worker
from tests.conftest import dp_sgd_spec, upload
from worker.single_job_prefetch import SingleJobPrefetch

EVENT = privacy.event_to_json(
    privacy.PoissonSampledGaussianEvent(sampling_probability=0.05, noise_multiplier=1.0, count=40)
)


def test_the_prefetch_answers_only_for_the_planned_event() -> None:
    prefetch = SingleJobPrefetch.start(EVENT, delta=1e-6, algorithm="dp-sgd")
    other = privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=0.05, noise_multiplier=1.0, count=39)
    )
    assert prefetch.result_for(other) is None  # stopped early, say: the caller computes its own
    got = prefetch.result_for(dict(EVENT))
    assert got is not None
    expected = privacy.capped_single_job_epsilon(privacy.event_from_json(EVENT), 1e-6, zcdp_is_gaussian=True)
    assert got.epsilon == expected.epsilon and got.method == expected.method


def test_a_failed_prefetch_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> Any:
        raise RuntimeError("no child processes here")

    monkeypatch.setattr(prefetch_module, "report_single_job_epsilon", broken)
    assert SingleJobPrefetch.start(EVENT, delta=1e-6, algorithm="dp-sgd").result_for(EVENT) is None


def test_a_job_that_ran_as_planned_takes_the_epsilon_computed_while_it_trained(
    alice: TestClient,
    settings: Settings,
    database: Database,
    digits_csv: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []
    real = prefetch_module.report_single_job_epsilon

    def on_the_prefetch_thread(*args: Any, **kwargs: Any) -> privacy.SingleJobEpsilon:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    def not_after_training(*_args: object, **_kwargs: object) -> Any:
        raise AssertionError("the single-job epsilon was computed again after training")

    monkeypatch.setattr(runner_module, "PREFETCH_SINGLE_JOB_ON", {"cpu", "cuda"})  # as on a GPU worker
    monkeypatch.setattr(prefetch_module, "report_single_job_epsilon", on_the_prefetch_thread)
    monkeypatch.setattr(released_report_module, "report_single_job_epsilon", not_after_training)
    dataset = upload(alice, digits_csv).json()["id"]
    job = run_on_worker(alice, settings, database, dp_sgd_spec(dataset))
    assert threads == ["single-job-epsilon"]
    report = alice.get(f"/v1/jobs/{job}/report").json()
    assert report["event"] == report["reserved_event"]  # ran as planned
    expected = privacy.capped_single_job_epsilon(
        privacy.event_from_json(report["event"]), report["epsilon"]["delta"], zcdp_is_gaussian=True
    )
    assert report["epsilon"]["prv_upper_bound"] == pytest.approx(expected.epsilon, rel=1e-12)
    assert report["epsilon"]["single_job_method"] == expected.method
