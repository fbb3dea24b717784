"""A report built by the worker's own builder from stand-in rows, for tests of what it says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kernel import privacy
from kernel.reporting.privacy_report import build_report, report_single_job_epsilon


class Row(SimpleNamespace):
    """A stand-in for a database row: columns not given read as None."""

    def __getattr__(self, name: str) -> None:
        return None


def small_report(
    *,
    epsilon_ledger: float = 3.00012,
    secure_gaussian: bool = True,
    adjustments: list[dict[str, Any]] | None = None,
    classes_declared: bool = False,
    steps_planned: int = 10,
) -> dict[str, Any]:
    """The report of a 10-step DP-SGD job (q = 0.01, σ = 1.1) with the given reserved ε; with
    ``steps_planned`` above 10 it stopped early."""
    event = privacy.event_to_json(
        privacy.PoissonSampledGaussianEvent(sampling_probability=0.01, noise_multiplier=1.1, count=10)
    )
    job = Row(
        id="job_1",
        delta=1e-05,
        epsilon_ledger=epsilon_ledger,
        model_name="logistic-regression",
        algorithm="dp-sgd",
        sampling_probability=0.01,
        noise_multiplier=1.1,
        steps_planned=steps_planned,
        steps_run=10,
        event=event,
        spec={
            "dataset_id": "ds_1",
            "model": {"name": "logistic-regression", "params": {}},
            "algorithm": {"name": "dp-sgd", "hyperparameters": {}},
            "privacy": {"target_epsilon": None, "noise_multiplier": 1.1, "delta": 1e-05},
            "training": {"epochs": None, "steps": steps_planned, "batch_size": 10, "learning_rate": 0.1},
        },
    )
    dataset = Row(
        id="ds_1",
        name="d",
        sha256="0" * 64,
        n_rows=1000,
        feature_shape=[4],
        task="classification",
        n_classes=2,
        classes_declared=classes_declared,
    )
    return build_report(
        job=job,
        dataset=dataset,
        sensitivity=1.0,
        expected_batch_size=10.0,
        sampling="poisson",  # type: ignore[arg-type]
        sensitivity_norm="l2",
        actual_event=event,
        budget_before={},
        budget_after={},
        commit_entry=SimpleNamespace(seq=3, hash="ab" * 32),
        adjustments=adjustments or [],  # type: ignore[arg-type]
        metrics=None,
        algorithm_notes={},
        model_sha256="cd" * 32,
        secure_gaussian=secure_gaussian,
        single_job=report_single_job_epsilon(event, delta=job.delta, algorithm=job.algorithm),
    )
