"""ε of a finished job's first k training steps, k = 1..T (the steps its COMMIT covers), re-derived
through ``kernel.privacy``.

Why re-derive instead of scaling counts in the event JSON: an algorithm's event need not be k
copies of one step (``PrivacyPlan.event_for(σ, k)`` is the authority, docs/privacy-model.md#cost), so the
plan is rebuilt from the stored spec and the dataset's public facts exactly as the worker does,
and used only if it reproduces the event the report states. Otherwise no curve is drawn and the
page says why — a plot that might disagree with the charged event is worse than none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernel import privacy
from kernel.db.orm import Dataset, Job
from kernel.jobs.planning import compose_job_event, rebuild_plan
from kernel.schemas.stored_spec import stored_spec

MAX_POINTS = 60


@dataclass(frozen=True)
class StepSeries:
    """Ledger ε (RDP converted at δ/|A|) of the first k training steps, at sampled k."""

    steps: tuple[int, ...]
    epsilon: tuple[float, ...]
    delta: float


class SeriesUnavailable(Exception):
    """The job's event could not be re-derived from its spec; the reason is shown to the reader."""


def sampled_steps(total: int, *, max_points: int = MAX_POINTS) -> tuple[int, ...]:
    """1..total when short, else about ``max_points`` evenly spaced k that include 1 and total."""
    if total <= max_points:
        return tuple(range(1, total + 1))
    stride = total / (max_points - 1)
    picked = {1, total} | {max(1, min(total, math.ceil(i * stride))) for i in range(1, max_points - 1)}
    return tuple(sorted(picked))


def epsilon_by_steps(job: Job, dataset: Dataset, report: dict[str, Any]) -> StepSeries:
    """The series for the report's job; raises :class:`SeriesUnavailable` with a reason."""
    if stored_spec(job).is_tuning:
        raise SeriesUnavailable(
            "this job is a hyperparameter tuning: its charge is the whole tuning's, not a function of one trial's steps"
        )
    try:
        plan, evaluation = rebuild_plan(job.spec, job.algorithm, dataset)
    except Exception as exc:  # noqa: BLE001 - any rebuild failure (algorithm removed or changed) means no curve
        raise SeriesUnavailable(f"the job's plan could not be rebuilt ({type(exc).__name__})") from None
    mechanism = report.get("mechanism") or {}
    if "steps_run" not in mechanism:
        raise SeriesUnavailable(str(report.get("mechanism_unavailable") or "the report states no steps"))
    # the steps its COMMIT covers: those run, or (a failed job) the whole planned run
    steps_run = int(mechanism.get("steps_charged", mechanism["steps_run"]))
    # a succeeded job's event includes its released evaluation; one that stopped early has none
    rebuilt = [
        privacy.event_to_json(
            compose_job_event(plan, evaluation, noise_multiplier=job.noise_multiplier, steps=steps_run, evaluated=e)
        )
        for e in (True, False)
    ]
    if report["event"] not in rebuilt:
        raise SeriesUnavailable("the rebuilt event differs from the event in the report")
    delta = float(report["epsilon"]["delta"])
    ks = sampled_steps(max(steps_run, 1))
    epsilons = tuple(
        privacy.RdpAccountant()
        .compose(compose_job_event(plan, evaluation, noise_multiplier=job.noise_multiplier, steps=k, evaluated=False))
        .epsilon(delta)
        for k in ks
    )
    return StepSeries(steps=ks, epsilon=epsilons, delta=delta)
